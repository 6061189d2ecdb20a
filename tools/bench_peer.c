// SPDX-License-Identifier: Apache-2.0
// bench_peer.c - server and client state machines of `tpipe bench
// transport` (protocol in bench_peer.h). Every callback runs on the loop
// thread of its process; a failure is recorded once in the bt_sync and
// stops the chain (no further submissions).
//
// Locks: only bs_mtx, never held while calling into the transport.

#include "bench_peer.h"
#include "tool.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "core/wire.h"

// ---- bt_sync ---------------------------------------------------------------

void
bt_sync_init(bt_sync *s)
{
    memset(s, 0, sizeof(*s));
    tp__mtx_init(&s->bs_mtx);
    tp__cv_init(&s->bs_cv);
    atomic_init(&s->bs_progress, 0);
}

void
bt_sync_fini(bt_sync *s)
{
    tp__cv_fini(&s->bs_cv);
    tp__mtx_fini(&s->bs_mtx);
}

void
bt_sync_reset(bt_sync *s)
{
    tp__mtx_lock(&s->bs_mtx);
    // After a failure the chain is dead: the next wait returns at once.
    if (!s->bs_failed) {
        s->bs_done = false;
    }
    tp__mtx_unlock(&s->bs_mtx);
}

void
bt_sync_done(bt_sync *s)
{
    tp__mtx_lock(&s->bs_mtx);
    s->bs_done = true;
    tp__cv_broadcast(&s->bs_cv);
    tp__mtx_unlock(&s->bs_mtx);
}

void
bt_sync_fail(bt_sync *s, const char *fmt, ...)
{
    tp__mtx_lock(&s->bs_mtx);
    if (!s->bs_failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(s->bs_msg, sizeof(s->bs_msg), fmt, ap);
        va_end(ap);
        s->bs_failed = true;
    }
    s->bs_done = true;
    tp__cv_broadcast(&s->bs_cv);
    tp__mtx_unlock(&s->bs_mtx);
}

bool
bt_sync_failed(bt_sync *s)
{
    tp__mtx_lock(&s->bs_mtx);
    bool f = s->bs_failed;
    tp__mtx_unlock(&s->bs_mtx);
    return f;
}

static inline void
bt_progress(bt_sync *s)
{
    atomic_fetch_add_explicit(&s->bs_progress, 1, memory_order_relaxed);
}

int
bt_sync_wait(bt_sync *s, uint64_t stall_ns)
{
    uint64_t last = atomic_load_explicit(&s->bs_progress, memory_order_relaxed);
    uint64_t last_t = tp__now_ns();
    int rc = 0;
    tp__mtx_lock(&s->bs_mtx);
    while (!s->bs_done) {
        tp__cv_wait_until(&s->bs_cv, &s->bs_mtx, tp__now_ns() + 200000000u);
        if (s->bs_done) {
            break;
        }
        uint64_t p =
            atomic_load_explicit(&s->bs_progress, memory_order_relaxed);
        uint64_t now = tp__now_ns();
        if (p != last) {
            last = p;
            last_t = now;
        } else if (now - last_t > stall_ns) {
            rc = -2;
            break;
        }
    }
    if (rc == 0 && s->bs_failed) {
        rc = -1;
    }
    tp__mtx_unlock(&s->bs_mtx);
    return rc;
}

uint8_t *
bt_buf_alloc(uint64_t n)
{
    void *p = NULL;
    if (n == 0 || posix_memalign(&p, 4096, (size_t)n) != 0) {
        return NULL;
    }
    // A fixed non-zero pattern: real pages, not the shared zero page.
    uint8_t *b = p;
    for (uint64_t i = 0; i < n; i++) {
        b[i] = (uint8_t)(i * 131u + 7u);
    }
    return b;
}

static void
bt_stamp(uint8_t *buf, uint64_t size, uint64_t v)
{
    tp__put_u64le(buf, v);
    tp__put_u64le(buf + size - 8, v);
}

static bool
bt_stamped(const uint8_t *buf, uint64_t size, uint64_t v)
{
    return tp__get_u64le(buf) == v && tp__get_u64le(buf + size - 8) == v;
}

static void
bt_set_buf(tp_aio *aio, void *buf, uint64_t len)
{
    tp_iov iov = {.iov_base = buf, .iov_len = len};
    tp_aio_set_iov(aio, 1, &iov);
}

// ---- server ----------------------------------------------------------------

static void srv_accept_cb(void *arg);
static void srv_rd_cb(void *arg);
static void srv_wr_cb(void *arg);
static void srv_slot_cb(void *arg);

int
bt_server_init(bt_server *s, tp_loop *loop, tp_listener *l, uint64_t max_size,
               unsigned nbufs)
{
    memset(s, 0, sizeof(*s));
    bt_sync_init(&s->sv_sync);
    s->sv_loop = loop;
    s->sv_listener = l;
    s->sv_max_size = max_size;
    s->sv_nbufs = nbufs < 2 ? 2 : nbufs;
    TP_ASSERT(s->sv_nbufs <= BT_MAX_WINDOW + 1);
    tp__aio_init(&s->sv_accept, srv_accept_cb, s);
    tp__aio_init(&s->sv_rd, srv_rd_cb, s);
    tp__aio_init(&s->sv_wr, srv_wr_cb, s);
    for (unsigned i = 0; i < BT_MAX_WINDOW + 1; i++) {
        s->sv_slots[i].sl_srv = s;
        s->sv_slots[i].sl_idx = i;
        tp__aio_init(&s->sv_slots[i].sl_aio, srv_slot_cb, &s->sv_slots[i]);
    }
    for (unsigned i = 0; i < s->sv_nbufs; i++) {
        s->sv_bufs[i] = bt_buf_alloc(max_size);
        if (s->sv_bufs[i] == NULL) {
            return -1;
        }
    }
    return 0;
}

void
bt_server_fini(bt_server *s)
{
    tp__aio_fini(&s->sv_accept);
    tp__aio_fini(&s->sv_rd);
    tp__aio_fini(&s->sv_wr);
    for (unsigned i = 0; i < BT_MAX_WINDOW + 1; i++) {
        tp__aio_fini(&s->sv_slots[i].sl_aio);
    }
    for (unsigned i = 0; i < s->sv_nbufs; i++) {
        free(s->sv_bufs[i]);
    }
    tp__conn_unref(s->sv_conn);
    s->sv_conn = NULL;
    bt_sync_fini(&s->sv_sync);
}

void
bt_server_start(bt_server *s)
{
    tp__listener_accept(s->sv_listener, &s->sv_accept);
}

static bool
srv_check(bt_server *s, tp_aio *aio, const char *what)
{
    bt_progress(&s->sv_sync);
    const tp_error *e = tp_aio_error(aio);
    if (e != NULL) {
        bt_sync_fail(&s->sv_sync, "server %s: %s", what, tp_error_message(e));
        return false;
    }
    return !bt_sync_failed(&s->sv_sync);
}

static void
srv_read_ctrl(bt_server *s)
{
    s->sv_rd_data = false;
    bt_set_buf(&s->sv_rd, s->sv_ctrl, BT_CTRL_LEN);
    tp__conn_read(s->sv_conn, &s->sv_rd);
}

static void
srv_read_ping(bt_server *s)
{
    s->sv_rd_data = true;
    bt_set_buf(&s->sv_rd, s->sv_bufs[s->sv_cur], s->sv_size);
    tp__conn_read(s->sv_conn, &s->sv_rd);
}

static void
srv_write(bt_server *s, void *buf, uint64_t len)
{
    s->sv_wr_busy = true;
    bt_set_buf(&s->sv_wr, buf, len);
    tp__conn_write(s->sv_conn, &s->sv_wr);
}

static void
srv_send_ack(bt_server *s, uint64_t a, uint64_t b)
{
    // The client waits for every echo before it sends the control message
    // that leads here, so the write aio is normally idle; if its callback
    // has not run yet, the ack goes out from there.
    tp__put_u64le(s->sv_ack, a);
    tp__put_u64le(s->sv_ack + 8, b);
    if (s->sv_wr_busy) {
        s->sv_ack_pending = true;
        return;
    }
    srv_write(s, s->sv_ack, BT_ACK_LEN);
}

static void
srv_accept_cb(void *arg)
{
    bt_server *s = arg;
    if (!srv_check(s, &s->sv_accept, "accept")) {
        return;
    }
    s->sv_conn = tp_aio_get_output(&s->sv_accept, 0);
    srv_read_ctrl(s);
}

static void
srv_stream_post(bt_server *s, bt_slot *sl)
{
    s->sv_posted++;
    bt_set_buf(&sl->sl_aio, s->sv_bufs[sl->sl_idx], s->sv_size);
    tp__conn_read(s->sv_conn, &sl->sl_aio);
}

static void
srv_ctrl(bt_server *s)
{
    const uint8_t *p = s->sv_ctrl;
    uint32_t magic = tp__get_u32le(p);
    unsigned op = tp__get_u32le(p + 4);
    uint64_t size = tp__get_u64le(p + 8);
    uint64_t count = tp__get_u64le(p + 16);
    if (magic != BT_MAGIC) {
        bt_sync_fail(&s->sv_sync, "server: bad control message (magic %08x)",
                     (unsigned)magic);
        return;
    }
    if ((op == BT_OP_PING || op == BT_OP_STREAM) &&
        (size < BT_MIN_SIZE || size > s->sv_max_size)) {
        bt_sync_fail(&s->sv_sync, "server: bad size %llu (max %llu)",
                     (unsigned long long)size,
                     (unsigned long long)s->sv_max_size);
        return;
    }
    s->sv_op = op;
    s->sv_size = size;
    s->sv_count = count;
    switch (op) {
    case BT_OP_PING:
        s->sv_cur = 0;
        s->sv_echo_pending = false;
        srv_read_ping(s);
        break;
    case BT_OP_STREAM:
        s->sv_posted = 0;
        s->sv_received = 0;
        if (count == 0) {
            srv_send_ack(s, 0, 0);
            srv_read_ctrl(s);
            break;
        }
        for (unsigned i = 0; i < s->sv_nbufs && s->sv_posted < count; i++) {
            srv_stream_post(s, &s->sv_slots[i]);
        }
        break;
    case BT_OP_IDLE:
        // Nothing is sent: this read stays pending until IDLE_END.
        s->sv_idle_cpu_ns = tool_cpu_ns();
        s->sv_idle_wall_ns = tp__now_ns();
        srv_read_ctrl(s);
        break;
    case BT_OP_IDLE_END:
        srv_send_ack(s, tool_cpu_ns() - s->sv_idle_cpu_ns,
                     tp__now_ns() - s->sv_idle_wall_ns);
        srv_read_ctrl(s);
        break;
    case BT_OP_QUIT:
        s->sv_quitting = true;
        srv_send_ack(s, 0, 0);
        break;
    default:
        bt_sync_fail(&s->sv_sync, "server: unknown control op %u", op);
    }
}

static void
srv_rd_cb(void *arg)
{
    bt_server *s = arg;
    if (!srv_check(s, &s->sv_rd, s->sv_rd_data ? "ping read" : "read")) {
        return;
    }
    if (!s->sv_rd_data) {
        srv_ctrl(s);
        return;
    }
    // A ping message: echo it first (latency), then post the next read
    // into the other buffer while the echo may still be going out.
    uint8_t *buf = s->sv_bufs[s->sv_cur];
    uint64_t stamp = tp__get_u64le(buf);
    if (tp__get_u64le(buf + s->sv_size - 8) != stamp) {
        bt_sync_fail(&s->sv_sync,
                     "server: ping message of %llu bytes corrupted "
                     "(first/last stamps differ)",
                     (unsigned long long)s->sv_size);
        return;
    }
    if (s->sv_wr_busy) {
        s->sv_echo_pending = true;
        s->sv_echo_buf = s->sv_cur;
    } else {
        srv_write(s, buf, s->sv_size);
    }
    if (stamp & BT_STOP) {
        srv_read_ctrl(s);
    } else {
        s->sv_cur ^= 1u;
        srv_read_ping(s);
    }
}

static void
srv_wr_cb(void *arg)
{
    bt_server *s = arg;
    s->sv_wr_busy = false;
    if (!srv_check(s, &s->sv_wr, "write")) {
        return;
    }
    if (s->sv_echo_pending) {
        s->sv_echo_pending = false;
        srv_write(s, s->sv_bufs[s->sv_echo_buf], s->sv_size);
        return;
    }
    if (s->sv_ack_pending) {
        s->sv_ack_pending = false;
        srv_write(s, s->sv_ack, BT_ACK_LEN);
        return;
    }
    if (s->sv_quitting) {
        bt_sync_done(&s->sv_sync);
    }
}

static void
srv_slot_cb(void *arg)
{
    bt_slot *sl = arg;
    bt_server *s = sl->sl_srv;
    if (!srv_check(s, &sl->sl_aio, "stream read")) {
        return;
    }
    const uint8_t *buf = s->sv_bufs[sl->sl_idx];
    if (!bt_stamped(buf, s->sv_size, BT_STREAM_STAMP ^ s->sv_size)) {
        bt_sync_fail(
            &s->sv_sync, "server: stream message %llu of %llu bytes corrupted",
            (unsigned long long)s->sv_received, (unsigned long long)s->sv_size);
        return;
    }
    s->sv_received++;
    if (s->sv_posted < s->sv_count) {
        srv_stream_post(s, sl);
    }
    if (s->sv_received == s->sv_count) {
        srv_send_ack(s, s->sv_received, 0);
        srv_read_ctrl(s);
    }
}

// ---- client ----------------------------------------------------------------

static void cl_cw_cb(void *arg);
static void cl_ack_cb(void *arg);
static void cl_rd_cb(void *arg);
static void cl_wr_cb(void *arg);
static void cl_swr_cb(void *arg);

int
bt_client_init(bt_client *c, tp_loop *loop, tp_conn *conn, uint64_t max_size,
               uint64_t max_iters)
{
    memset(c, 0, sizeof(*c));
    bt_sync_init(&c->cl_sync);
    c->cl_loop = loop;
    c->cl_conn = conn;
    c->cl_max_size = max_size;
    tp__aio_init(&c->cl_cw, cl_cw_cb, c);
    tp__aio_init(&c->cl_ackrd, cl_ack_cb, c);
    tp__aio_init(&c->cl_rd, cl_rd_cb, c);
    tp__aio_init(&c->cl_wr, cl_wr_cb, c);
    for (unsigned i = 0; i < BT_MAX_WINDOW; i++) {
        c->cl_swr[i].ws_cl = c;
        tp__aio_init(&c->cl_swr[i].ws_aio, cl_swr_cb, &c->cl_swr[i]);
    }
    c->cl_sbuf = bt_buf_alloc(max_size);
    c->cl_rbuf = bt_buf_alloc(max_size);
    // Room for every measured round trip up to a cap; more rounds than
    // this are not kept (the budget ends the run long before, normally).
    c->cl_lat_cap = max_iters < 4000000 ? max_iters : 4000000;
    c->cl_lat = malloc((c->cl_lat_cap ? c->cl_lat_cap : 1) * sizeof(double));
    if (c->cl_sbuf == NULL || c->cl_rbuf == NULL || c->cl_lat == NULL) {
        return -1;
    }
    return 0;
}

void
bt_client_fini(bt_client *c)
{
    tp__aio_fini(&c->cl_cw);
    tp__aio_fini(&c->cl_ackrd);
    tp__aio_fini(&c->cl_rd);
    tp__aio_fini(&c->cl_wr);
    for (unsigned i = 0; i < BT_MAX_WINDOW; i++) {
        tp__aio_fini(&c->cl_swr[i].ws_aio);
    }
    free(c->cl_sbuf);
    free(c->cl_rbuf);
    free(c->cl_lat);
    bt_sync_fini(&c->cl_sync);
}

static bool
cl_check(bt_client *c, tp_aio *aio, const char *what)
{
    bt_progress(&c->cl_sync);
    const tp_error *e = tp_aio_error(aio);
    if (e != NULL) {
        bt_sync_fail(&c->cl_sync, "client %s: %s", what, tp_error_message(e));
        return false;
    }
    return !bt_sync_failed(&c->cl_sync);
}

static void
cl_write_ctrl(bt_client *c, unsigned op, uint64_t size, uint64_t count,
              uint64_t window)
{
    uint8_t *p = c->cl_ctrl;
    tp__put_u32le(p, BT_MAGIC);
    tp__put_u32le(p + 4, op);
    tp__put_u64le(p + 8, size);
    tp__put_u64le(p + 16, count);
    tp__put_u64le(p + 24, window);
    c->cl_cw_done = false;
    bt_set_buf(&c->cl_cw, c->cl_ctrl, BT_CTRL_LEN);
    tp__conn_write(c->cl_conn, &c->cl_cw);
}

static void
cl_post_ack(bt_client *c)
{
    if (c->cl_ack_posted) {
        return;
    }
    c->cl_ack_posted = true;
    c->cl_ack_done = false;
    bt_set_buf(&c->cl_ackrd, c->cl_ack, BT_ACK_LEN);
    tp__conn_read(c->cl_conn, &c->cl_ackrd);
}

static void
cl_ctrl_maybe_done(bt_client *c)
{
    if (c->cl_cw_done && (!c->cl_ack_wanted || c->cl_ack_done)) {
        bt_sync_done(&c->cl_sync);
    }
}

static void
cl_cw_cb(void *arg)
{
    bt_client *c = arg;
    if (!cl_check(c, &c->cl_cw, "control write")) {
        return;
    }
    c->cl_cw_done = true;
    if (c->cl_mode == BT_OP_IDLE || c->cl_mode == BT_OP_IDLE_END ||
        c->cl_mode == BT_OP_QUIT) {
        cl_ctrl_maybe_done(c);
    }
}

static void
cl_stream_maybe_done(bt_client *c)
{
    if (c->cl_acked && c->cl_completed == c->cl_count) {
        bt_sync_done(&c->cl_sync);
    }
}

static void
cl_ack_cb(void *arg)
{
    bt_client *c = arg;
    c->cl_ack_posted = false;
    if (!cl_check(c, &c->cl_ackrd, "ack read")) {
        return;
    }
    c->cl_ack_done = true;
    c->cl_ack_a = tp__get_u64le(c->cl_ack);
    c->cl_ack_b = tp__get_u64le(c->cl_ack + 8);
    if (c->cl_mode == BT_OP_STREAM) {
        c->cl_s_t1 = tp__now_ns();
        if (c->cl_ack_a != c->cl_count) {
            bt_sync_fail(&c->cl_sync,
                         "client: server acked %llu messages, sent %llu",
                         (unsigned long long)c->cl_ack_a,
                         (unsigned long long)c->cl_count);
            return;
        }
        c->cl_acked = true;
        cl_stream_maybe_done(c);
        return;
    }
    cl_ctrl_maybe_done(c);
}

// ---- client: ping-pong ----

static void
cl_round(bt_client *c)
{
    c->cl_stamp = (c->cl_round + 1) | (c->cl_stopping ? BT_STOP : 0);
    bt_stamp(c->cl_sbuf, c->cl_size, c->cl_stamp);
    c->cl_pending = 2;
    c->cl_t0 = tp__now_ns();
    bt_set_buf(&c->cl_wr, c->cl_sbuf, c->cl_size);
    tp__conn_write(c->cl_conn, &c->cl_wr);
    bt_set_buf(&c->cl_rd, c->cl_rbuf, c->cl_size);
    tp__conn_read(c->cl_conn, &c->cl_rd);
}

// Both the write and the read of a round completed.
static void
cl_round_done(bt_client *c)
{
    uint64_t t1 = tp__now_ns();
    if (!bt_stamped(c->cl_rbuf, c->cl_size, c->cl_stamp)) {
        bt_sync_fail(
            &c->cl_sync,
            "client: echo of %llu bytes in round %llu corrupted "
            "(stamp %llx/%llx, expected %llx)",
            (unsigned long long)c->cl_size, (unsigned long long)c->cl_round,
            (unsigned long long)tp__get_u64le(c->cl_rbuf),
            (unsigned long long)tp__get_u64le(c->cl_rbuf + c->cl_size - 8),
            (unsigned long long)c->cl_stamp);
        return;
    }
    if (c->cl_stopping) {
        bt_sync_done(&c->cl_sync);
        return;
    }
    c->cl_round++;
    if (c->cl_round == c->cl_warm) {
        c->cl_tstart = t1;
    } else if (c->cl_round > c->cl_warm && c->cl_nlat < c->cl_lat_cap) {
        c->cl_lat[c->cl_nlat++] = (double)(t1 - c->cl_t0) / 1e3;
    }
    uint64_t measured = c->cl_round > c->cl_warm ? c->cl_round - c->cl_warm : 0;
    bool more =
        c->cl_round <= c->cl_warm || measured < c->cl_min_iters ||
        (measured < c->cl_max_iters && t1 - c->cl_tstart < c->cl_budget_ns);
    if (!more) {
        c->cl_stopping = true; // one last round tells the server to stop
    }
    cl_round(c);
}

static void
cl_rd_cb(void *arg)
{
    bt_client *c = arg;
    if (!cl_check(c, &c->cl_rd, "ping read")) {
        return;
    }
    if (--c->cl_pending == 0) {
        cl_round_done(c);
    }
}

static void
cl_wr_cb(void *arg)
{
    bt_client *c = arg;
    if (!cl_check(c, &c->cl_wr, "ping write")) {
        return;
    }
    if (--c->cl_pending == 0) {
        cl_round_done(c);
    }
}

static void
cl_start_pingpong_task(void *arg)
{
    bt_client *c = arg;
    c->cl_mode = BT_OP_PING;
    c->cl_round = 0;
    c->cl_nlat = 0;
    c->cl_stopping = false;
    c->cl_tstart = tp__now_ns();
    cl_write_ctrl(c, BT_OP_PING, c->cl_size, 0, 0);
    cl_round(c);
}

void
bt_client_start_pingpong(bt_client *c)
{
    bt_sync_reset(&c->cl_sync);
    tp__loop_call(c->cl_loop, cl_start_pingpong_task, c);
}

// ---- client: stream ----

static void
cl_stream_issue(bt_client *c, tp_aio *aio)
{
    c->cl_issued++;
    bt_set_buf(aio, c->cl_sbuf, c->cl_size);
    tp__conn_write(c->cl_conn, aio);
}

static void
cl_swr_cb(void *arg)
{
    bt_wslot *ws = arg;
    bt_client *c = ws->ws_cl;
    if (!cl_check(c, &ws->ws_aio, "stream write")) {
        return;
    }
    c->cl_completed++;
    if (c->cl_issued < c->cl_count) {
        cl_stream_issue(c, &ws->ws_aio);
    }
    cl_stream_maybe_done(c);
}

static void
cl_start_stream_task(void *arg)
{
    bt_client *c = arg;
    c->cl_mode = BT_OP_STREAM;
    c->cl_issued = 0;
    c->cl_completed = 0;
    c->cl_acked = false;
    bt_stamp(c->cl_sbuf, c->cl_size, BT_STREAM_STAMP ^ c->cl_size);
    c->cl_s_t0 = tp__now_ns();
    cl_post_ack(c);
    cl_write_ctrl(c, BT_OP_STREAM, c->cl_size, c->cl_count, c->cl_window);
    for (unsigned i = 0; i < c->cl_window && c->cl_issued < c->cl_count; i++) {
        cl_stream_issue(c, &c->cl_swr[i].ws_aio);
    }
    if (c->cl_count == 0) {
        cl_stream_maybe_done(c);
    }
}

void
bt_client_start_stream(bt_client *c)
{
    bt_sync_reset(&c->cl_sync);
    tp__loop_call(c->cl_loop, cl_start_stream_task, c);
}

// ---- client: control ----

typedef struct cl_ctrl_arg {
    bt_client *c;
    unsigned op;
    bool ack;
} cl_ctrl_arg;

static void
cl_start_ctrl_task(void *arg)
{
    cl_ctrl_arg *a = arg;
    bt_client *c = a->c;
    c->cl_mode = a->op;
    c->cl_ack_wanted = a->ack;
    c->cl_ack_done = false;
    // The ack read is posted before the control write; for IDLE it stays
    // pending (the "read with nothing sent" of the idle measurement) and
    // completes with the IDLE_END ack.
    cl_post_ack(c);
    cl_write_ctrl(c, a->op, 0, 0, 0);
}

void
bt_client_start_ctrl(bt_client *c, unsigned op, bool ack)
{
    cl_ctrl_arg a = {.c = c, .op = op, .ack = ack};
    bt_sync_reset(&c->cl_sync);
    tp__loop_call(c->cl_loop, cl_start_ctrl_task, &a);
}
