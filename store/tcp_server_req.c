// SPDX-License-Identifier: Apache-2.0
// tcp_server_req.c - the requests of the tcp store server: parsing a
// buffered request (every length checked against its bound before it is
// used), running it on the engine, building the reply, and parked
// requests: a get or wait whose keys are missing waits on the connection,
// not on a thread, and is woken by the engine's watch when a key is set
// or by the connection's timer at its deadline. Loop thread only.

#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/wire.h"
#include "tcp_server_int.h"

// ---- parsing ----

typedef struct req_cur {
    const uint8_t *rc_b;
    size_t rc_have;
    size_t rc_off;
    size_t *rc_need;
    const char **rc_why;
} req_cur;

// SRV_PARSE_OK if @n more bytes are buffered.
static srv_parse
cur_need(req_cur *p, size_t n)
{
    if (p->rc_have - p->rc_off < n) {
        *p->rc_need = p->rc_off + n;
        return SRV_PARSE_MORE;
    }
    return SRV_PARSE_OK;
}

static srv_parse
cur_bad(req_cur *p, const char *why)
{
    *p->rc_why = why;
    return SRV_PARSE_BAD;
}

// A key: u32 length (1..TP_STORE_MAX_KEY) and bytes without a NUL.
static srv_parse
cur_key(req_cur *p, size_t *off_p, uint32_t *len_p)
{
    srv_parse rc = cur_need(p, 4);
    if (rc != SRV_PARSE_OK) {
        return rc;
    }
    uint32_t n = tp__get_u32le(p->rc_b + p->rc_off);
    if (n == 0 || n > TP_STORE_MAX_KEY) {
        return cur_bad(p, "key length out of bounds");
    }
    p->rc_off += 4;
    if ((rc = cur_need(p, n)) != SRV_PARSE_OK) {
        return rc;
    }
    if (memchr(p->rc_b + p->rc_off, 0, n) != NULL) {
        return cur_bad(p, "key holds a NUL byte");
    }
    *off_p = p->rc_off;
    *len_p = n;
    p->rc_off += n;
    return SRV_PARSE_OK;
}

// A value: u64 length (<= @max) and bytes.
static srv_parse
cur_val(req_cur *p, int64_t max, size_t *off_p, uint64_t *len_p)
{
    srv_parse rc = cur_need(p, 8);
    if (rc != SRV_PARSE_OK) {
        return rc;
    }
    uint64_t n = tp__get_u64le(p->rc_b + p->rc_off);
    if (n > (uint64_t)max) {
        return cur_bad(p, "value longer than TP_STORE_MAX_VALUE");
    }
    p->rc_off += 8;
    if ((rc = cur_need(p, (size_t)n)) != SRV_PARSE_OK) {
        return rc;
    }
    *off_p = p->rc_off;
    *len_p = n;
    p->rc_off += (size_t)n;
    return SRV_PARSE_OK;
}

static srv_parse
req_parse_body(req_cur *p, int64_t max_value, srv_req *r)
{
    srv_parse rc = SRV_PARSE_OK;
    switch (r->r_op) {
    case TP_STORE_OP_SET:
    case TP_STORE_OP_APPEND:
        if ((rc = cur_key(p, &r->r_key, &r->r_klen)) == SRV_PARSE_OK) {
            rc = cur_val(p, max_value, &r->r_v1, &r->r_n1);
        }
        return rc;
    case TP_STORE_OP_GET:
    case TP_STORE_OP_DELETE:
    case TP_STORE_OP_DELETE_PREFIX:
        return cur_key(p, &r->r_key, &r->r_klen);
    case TP_STORE_OP_ADD:
        if ((rc = cur_key(p, &r->r_key, &r->r_klen)) == SRV_PARSE_OK &&
            (rc = cur_need(p, 8)) == SRV_PARSE_OK) {
            r->r_delta = (int64_t)tp__get_u64le(p->rc_b + p->rc_off);
            p->rc_off += 8;
        }
        return rc;
    case TP_STORE_OP_WAIT:
    case TP_STORE_OP_CHECK: {
        if ((rc = cur_need(p, 4)) != SRV_PARSE_OK) {
            return rc;
        }
        uint32_t n = tp__get_u32le(p->rc_b + p->rc_off);
        if (n == 0 || n > TP_STORE_MAX_WAIT) {
            return cur_bad(p, r->r_op == TP_STORE_OP_WAIT
                                  ? "wait: number of keys out of bounds"
                                  : "check: number of keys out of bounds");
        }
        p->rc_off += 4;
        r->r_nkeys = n;
        for (uint32_t i = 0; i < n && rc == SRV_PARSE_OK; i++) {
            size_t off;
            uint32_t len;
            rc = cur_key(p, &off, &len);
            if (i == 0) {
                r->r_key = off;
                r->r_klen = len;
            }
        }
        return rc;
    }
    case TP_STORE_OP_CAS:
        if ((rc = cur_key(p, &r->r_key, &r->r_klen)) == SRV_PARSE_OK &&
            (rc = cur_val(p, max_value, &r->r_v1, &r->r_n1)) == SRV_PARSE_OK) {
            rc = cur_val(p, max_value, &r->r_v2, &r->r_n2);
        }
        return rc;
    case TP_STORE_OP_NUM_KEYS:
        return SRV_PARSE_OK;
    default:
        return cur_bad(p, "unknown operation");
    }
}

srv_parse
tp__srv_req_parse(const srv_conn *c, srv_req *r, size_t *need_p,
                  const char **why_p)
{
    memset(r, 0, sizeof(*r));
    req_cur p = {c->sc_in, c->sc_in_len, 0, need_p, why_p};
    srv_parse rc = cur_need(&p, TP_STORE_HDR_LEN);
    if (rc != SRV_PARSE_OK) {
        return rc;
    }
    if (tp__get_u32le(c->sc_in) != TP_STORE_MAGIC) {
        return cur_bad(&p, "bad magic");
    }
    r->r_op = c->sc_in[4];
    r->r_timeout_ms = tp__get_u64le(c->sc_in + 8);
    p.rc_off = TP_STORE_HDR_LEN;
    rc = req_parse_body(&p, c->sc_srv->srv_lim.sl_max_value, r);
    r->r_len = p.rc_off;
    return rc;
}

// ---- replies ----

static void
reply_hdr(srv_conn *c, uint8_t status)
{
    uint8_t h[TP_STORE_RHDR_LEN] = {0};
    tp__put_u32le(h, TP_STORE_MAGIC);
    h[4] = status;
    tp__srv_out_put(c, h, sizeof(h));
}

static void
reply_ok(srv_conn *c, const void *body, size_t n)
{
    reply_hdr(c, TP_STORE_R_OK);
    tp__srv_out_put(c, body, n);
    c->sc_state = SC_WRITE;
}

static void
reply_val(srv_conn *c, const uint8_t *v, size_t n)
{
    uint8_t l[8];
    tp__put_u64le(l, (uint64_t)n);
    reply_ok(c, l, 8);
    tp__srv_out_put(c, v, n);
}

// Builds an error reply with @st and @msg.
static void
srv_reply_error(srv_conn *c, tp_status st, const char *msg)
{
    uint8_t b[8];
    if (st == TP_ETIMEDOUT) {
        reply_hdr(c, TP_STORE_R_TIMEOUT);
    } else {
        reply_hdr(c, TP_STORE_R_ERROR);
        tp__put_u32le(b, (uint32_t)(int32_t)st);
        tp__srv_out_put(c, b, 4);
    }
    size_t n = strnlen(msg, TP_STORE_MAX_MSG);
    tp__put_u32le(b, (uint32_t)n);
    tp__srv_out_put(c, b, 4);
    tp__srv_out_put(c, msg, n);
    c->sc_state = SC_WRITE;
}

// Replies with @err (consumed).
static void
reply_err(srv_conn *c, tp_status st, tp_error *err)
{
    srv_reply_error(c, st, tp_error_message(err));
    tp_error_unref(err);
}

// ---- parked requests ----

static void
park_link(srv_conn *c)
{
    tp_store_server *srv = c->sc_srv;
    c->sc_pprev = NULL;
    c->sc_pnext = srv->srv_parked;
    if (srv->srv_parked != NULL) {
        srv->srv_parked->sc_pprev = c;
    }
    srv->srv_parked = c;
    c->sc_state = SC_PARKED;
}

void
tp__srv_req_unpark(srv_conn *c)
{
    if (c->sc_keys == NULL) {
        return;
    }
    tp_store_server *srv = c->sc_srv;
    if (c->sc_state == SC_PARKED) {
        if (c->sc_pprev != NULL) {
            c->sc_pprev->sc_pnext = c->sc_pnext;
        } else {
            srv->srv_parked = c->sc_pnext;
        }
        if (c->sc_pnext != NULL) {
            c->sc_pnext->sc_pprev = c->sc_pprev;
        }
        c->sc_pnext = c->sc_pprev = NULL;
    }
    for (uint32_t i = 0; i < c->sc_nkeys; i++) {
        tp__free(c->sc_keys[i]);
    }
    tp__free(c->sc_keys);
    c->sc_keys = NULL;
    c->sc_nkeys = 0;
}

// Checks the keys of @c's get or wait now. On success, or if @final,
// replies (the value, OK, or the timeout text) and returns true; else
// returns false and leaves the request as it is.
static bool
park_check(srv_conn *c, bool final)
{
    tp__kv *kv = &c->sc_srv->srv_kv;
    tp_error *err = NULL;
    uint8_t *v = NULL;
    size_t n = 0;
    tp_status st;
    if (c->sc_op == TP_STORE_OP_GET) {
        st = tp__kv_get(kv, c->sc_keys[0], 0, &v, &n, &err);
    } else {
        st = tp__kv_wait(kv, (const char *const *)c->sc_keys, c->sc_nkeys, 0,
                         &err);
    }
    if (st == TP_ETIMEDOUT && !final) {
        tp_error_unref(err);
        return false;
    }
    bool parked = c->sc_state == SC_PARKED;
    tp__srv_req_unpark(c);
    if (st != TP_OK) {
        reply_err(c, st, err);
    } else if (c->sc_op == TP_STORE_OP_GET) {
        reply_val(c, v, n);
    } else {
        reply_ok(c, NULL, 0);
    }
    tp__free(v);
    if (parked) {
        tp__timer_stop(c->sc_srv->srv_loop, &c->sc_timer);
    }
    return true;
}

// A get or wait: answer now if the keys are there, else park until they
// are or the deadline passes.
static void
run_waiting(srv_conn *c, const srv_req *r)
{
    uint32_t n = r->r_op == TP_STORE_OP_GET ? 1 : r->r_nkeys;
    c->sc_keys = tp__zalloc((size_t)n * sizeof(char *));
    if (c->sc_keys == NULL) {
        srv_reply_error(c, TP_ENOMEM, "out of memory");
        return;
    }
    c->sc_nkeys = n;
    size_t off = r->r_key - 4;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t len = tp__get_u32le(c->sc_in + off);
        char *k = tp__alloc((size_t)len + 1);
        if (k == NULL) {
            tp__srv_req_unpark(c);
            srv_reply_error(c, TP_ENOMEM, "out of memory");
            return;
        }
        memcpy(k, c->sc_in + off + 4, len);
        k[len] = 0;
        c->sc_keys[i] = k;
        off += 4 + (size_t)len;
    }
    c->sc_op = r->r_op;
    uint64_t tmo = r->r_timeout_ms;
    c->sc_deadline =
        tp__deadline_after_ms(tmo > (uint64_t)INT64_MAX ? 0 : (int64_t)tmo);
    bool final = tp__now_ns() >= c->sc_deadline;
    if (park_check(c, final)) {
        return;
    }
    park_link(c);
    // A parked client is not idle: only its own deadline closes the wait.
    if (c->sc_deadline != UINT64_MAX) {
        tp__timer_start(c->sc_srv->srv_loop, &c->sc_timer, c->sc_deadline);
    } else {
        tp__timer_stop(c->sc_srv->srv_loop, &c->sc_timer);
    }
}

void
tp__srv_req_expire(srv_conn *c)
{
    if (c->sc_state == SC_PARKED) {
        park_check(c, true);
        tp__srv_conn_schedule(c);
    }
}

void
tp__srv_req_watch(void *arg, const char *key)
{
    tp_store_server *srv = arg;
    srv_conn *next;
    for (srv_conn *c = srv->srv_parked; c != NULL; c = next) {
        next = c->sc_pnext;
        bool match = false;
        for (uint32_t i = 0; i < c->sc_nkeys && !match; i++) {
            match = strcmp(c->sc_keys[i], key) == 0;
        }
        // Only the reply is built here: the connection writes it from its
        // own task, so no connection closes while this list is walked.
        if (match && park_check(c, false)) {
            tp__srv_conn_schedule(c);
        }
    }
}

// ---- running a request ----

// A check: whether every key is set now, never parked.
static void
run_check(srv_conn *c, const srv_req *r)
{
    tp__kv *kv = &c->sc_srv->srv_kv;
    size_t off = r->r_key - 4;
    bool all = true;
    char key[TP_STORE_MAX_KEY + 1];
    for (uint32_t i = 0; i < r->r_nkeys && all; i++) {
        uint32_t len = tp__get_u32le(c->sc_in + off);
        memcpy(key, c->sc_in + off + 4, len);
        key[len] = 0;
        const char *k = key;
        all = tp__kv_check(kv, &k, 1);
        off += 4 + (size_t)len;
    }
    uint8_t b = all ? 1 : 0;
    reply_ok(c, &b, 1);
}

void
tp__srv_req_run(srv_conn *c, const srv_req *r)
{
    tp__kv *kv = &c->sc_srv->srv_kv;
    char key[TP_STORE_MAX_KEY + 1];
    memcpy(key, c->sc_in + r->r_key, r->r_klen);
    key[r->r_klen] = 0;
    const uint8_t *v1 = c->sc_in + r->r_v1, *v2 = c->sc_in + r->r_v2;
    tp_error *err = NULL;
    tp_status st;
    uint8_t b[8];
    switch (r->r_op) {
    case TP_STORE_OP_SET:
        st = tp__kv_set(kv, key, v1, (size_t)r->r_n1, &err);
        if (st == TP_OK) {
            reply_ok(c, NULL, 0);
        } else {
            reply_err(c, st, err);
        }
        break;
    case TP_STORE_OP_GET:
    case TP_STORE_OP_WAIT:
        run_waiting(c, r);
        break;
    case TP_STORE_OP_APPEND:
        st = tp__kv_append(kv, key, v1, (size_t)r->r_n1,
                           c->sc_srv->srv_lim.sl_max_value, &err);
        if (st == TP_OK) {
            reply_ok(c, NULL, 0);
        } else {
            reply_err(c, st, err);
        }
        break;
    case TP_STORE_OP_CHECK:
        run_check(c, r);
        break;
    case TP_STORE_OP_ADD: {
        int64_t nv = 0;
        st = tp__kv_add(kv, key, r->r_delta, &nv, &err);
        tp__put_u64le(b, (uint64_t)nv);
        if (st == TP_OK) {
            reply_ok(c, b, 8);
        } else {
            reply_err(c, st, err);
        }
        break;
    }
    case TP_STORE_OP_CAS: {
        uint8_t *out = NULL;
        size_t nout = 0;
        st = tp__kv_compare_set(kv, key, v1, (size_t)r->r_n1, v2,
                                (size_t)r->r_n2, &out, &nout, &err);
        if (st == TP_OK) {
            reply_val(c, out, nout);
        } else {
            reply_err(c, st, err);
        }
        tp__free(out);
        break;
    }
    case TP_STORE_OP_DELETE: {
        bool d = false;
        tp__kv_delete(kv, key, &d);
        b[0] = d ? 1 : 0;
        reply_ok(c, b, 1);
        break;
    }
    case TP_STORE_OP_DELETE_PREFIX: {
        int64_t n = 0;
        tp__kv_delete_prefix(kv, key, &n);
        tp__put_u64le(b, (uint64_t)n);
        reply_ok(c, b, 8);
        break;
    }
    default: // TP_STORE_OP_NUM_KEYS; the parser refused the others
        tp__put_u64le(b, (uint64_t)tp__kv_num_keys(kv));
        reply_ok(c, b, 8);
        break;
    }
}
