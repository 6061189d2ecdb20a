// SPDX-License-Identifier: Apache-2.0
// bench_pipe_client.c - `tpipe bench pipe`'s client: connects,
// checks the negotiated combination and measures ping-pong and stream.

#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <tpipe/pipe.h>

#include "bench_pipe.h"
#include "core/platform.h"
#include "tool.h"

// ---- client: measures ------------------------------------------------------

enum { BP_MODE_PING = 1, BP_MODE_STREAM, BP_MODE_QUIT, BP_MODE_BIBW };

typedef struct bp_client bp_client;
typedef struct bp_wslot {
    bp_client *ws_cl;
    tp_aio *ws_aio;
    tp_message ws_msg;
    tp_msg_buf ws_t;
    char ws_md;
} bp_wslot;

struct bp_client {
    bt_sync cl_sync;
    tp_mtx cl_mtx; // the main thread's start vs the loop thread
    const bp_opts *cl_opts;
    tp_pipe *cl_pipe;
    uint8_t *cl_sbuf;
    uint8_t *cl_rbuf;
    uint8_t *cl_spay;
    uint8_t *cl_rpay;
    tp_msg_buf *cl_wp; // payloads of every write (the same source)
    bp_wslot cl_wr[BT_MAX_WINDOW];
    tp_aio *cl_desc;
    tp_aio *cl_rd;
    tp_message *cl_rmsg;
    // measurement parameters (main thread, before a start)
    int cl_mode;
    uint64_t cl_size;
    uint64_t cl_min_iters;
    uint64_t cl_max_iters;
    uint64_t cl_budget_ns;
    unsigned cl_warm;
    unsigned cl_window;
    uint64_t cl_count;
    // ping-pong (loop thread)
    uint64_t cl_round;
    int cl_pending;
    uint64_t cl_t0;
    uint64_t cl_tstart;
    double *cl_lat;
    uint64_t cl_nlat;
    // stream (loop thread)
    uint64_t cl_issued;
    uint64_t cl_completed;
    uint64_t cl_s_t0;
    uint64_t cl_s_t1;
    bool cl_acked;
    char cl_rop; // bibw: the message being read ('b', or 'a': the last)
};

static void bp_cl_wr_cb(void *arg);
static void bp_cl_desc_cb(void *arg);
static void bp_cl_rd_cb(void *arg);

static void
bp_client_fini(bp_client *c)
{
    for (unsigned i = 0; i < BT_MAX_WINDOW; i++) {
        tp_aio_destroy(c->cl_wr[i].ws_aio);
    }
    tp_aio_destroy(c->cl_desc);
    tp_aio_destroy(c->cl_rd);
    tp_message_destroy(c->cl_rmsg);
    if (c->cl_opts != NULL) {
        bp_buf_free(c->cl_opts->bo_src, c->cl_sbuf);
        bp_buf_free(c->cl_opts->bo_src, c->cl_rbuf);
    }
    free(c->cl_spay);
    free(c->cl_rpay);
    free(c->cl_wp);
    free(c->cl_lat);
    if (c->cl_opts != NULL) {
        tp__mtx_fini(&c->cl_mtx);
        bt_sync_fini(&c->cl_sync);
    }
    memset(c, 0, sizeof(*c));
}

// On failure (out of memory, a device allocation refused) @why says what.
static bool
bp_client_init(bp_client *c, const bp_opts *o, tp_pipe *p, char *why,
               size_t why_len)
{
    memset(c, 0, sizeof(*c));
    bt_sync_init(&c->cl_sync);
    tp__mtx_init(&c->cl_mtx);
    c->cl_opts = o;
    c->cl_pipe = p;
    int64_t tmo = (int64_t)(o->bo_com.bo_stall_s * 1000);
    uint32_t np = o->bo_npayloads;
    snprintf(why, why_len, "out of memory");
    // The tensors (sent, and the echoes read back) on the source device.
    c->cl_sbuf = bp_buf_alloc(o->bo_src, o->bo_com.bo_max_size, why, why_len);
    c->cl_rbuf =
        c->cl_sbuf == NULL
            ? NULL
            : bp_buf_alloc(o->bo_src, o->bo_com.bo_max_size, why, why_len);
    c->cl_lat = calloc(o->bo_com.bo_iters, sizeof(double));
    if (c->cl_sbuf == NULL || c->cl_rbuf == NULL || c->cl_lat == NULL ||
        tp_aio_create(bp_cl_desc_cb, c, &c->cl_desc) != TP_OK ||
        tp_aio_create(bp_cl_rd_cb, c, &c->cl_rd) != TP_OK) {
        return false;
    }
    tp_aio_set_timeout(c->cl_desc, tmo);
    tp_aio_set_timeout(c->cl_rd, tmo);
    if (np > 0) {
        c->cl_spay = bt_buf_alloc(np * o->bo_payload_size);
        c->cl_rpay = bt_buf_alloc(np * o->bo_payload_size);
        c->cl_wp = calloc(np, sizeof(tp_msg_buf));
        if (c->cl_spay == NULL || c->cl_rpay == NULL || c->cl_wp == NULL) {
            return false;
        }
        for (uint32_t i = 0; i < np; i++) {
            c->cl_wp[i] = (tp_msg_buf){
                .data = c->cl_spay + i * o->bo_payload_size,
                .len = o->bo_payload_size,
                .device = {.type = TP_DEVICE_CPU},
            };
        }
    }
    for (unsigned i = 0; i < BT_MAX_WINDOW; i++) {
        bp_wslot *w = &c->cl_wr[i];
        w->ws_cl = c;
        if (tp_aio_create(bp_cl_wr_cb, w, &w->ws_aio) != TP_OK) {
            return false;
        }
        tp_aio_set_timeout(w->ws_aio, tmo);
    }
    return true;
}

static void
bp_cl_fail(bp_client *c, const char *what, const tp_aio *aio)
{
    bt_sync_fail(&c->cl_sync, "%s: %s", what,
                 tp_error_message(tp_aio_error(aio)));
}

// Submits a write of @md from slot @i: a tensor of @size bytes (none if
// 0) and, for data messages, the payloads.
static void
bp_cl_write(bp_client *c, unsigned i, char md, uint64_t size)
{
    bp_wslot *w = &c->cl_wr[i];
    w->ws_md = md;
    memset(&w->ws_msg, 0, sizeof(w->ws_msg));
    w->ws_msg.metadata = &w->ws_md;
    w->ws_msg.metadata_len = 1;
    if (size > 0) {
        w->ws_t = (tp_msg_buf){
            .data = c->cl_sbuf, .len = size, .device = c->cl_opts->bo_src};
        w->ws_msg.tensors = &w->ws_t;
        w->ws_msg.ntensors = 1;
        w->ws_msg.payloads = c->cl_wp;
        w->ws_msg.npayloads = c->cl_opts->bo_npayloads;
    }
    tp_pipe_write(c->cl_pipe, &w->ws_msg, w->ws_aio);
}

// Locked. One ping-pong round: the write and the echo's read. False
// (failed) when the stamp could not be written.
static bool
bp_cl_round(bp_client *c)
{
    char why[512];
    if (!bp_stamp_put(c->cl_opts->bo_src, c->cl_sbuf, c->cl_size,
                      0x1000 + c->cl_round, why, sizeof(why))) {
        bt_sync_fail(&c->cl_sync, "round %llu: %s",
                     (unsigned long long)c->cl_round, why);
        return false;
    }
    c->cl_pending = 2;
    c->cl_t0 = tp__now_ns();
    bp_cl_write(c, 0, 'P', c->cl_size);
    tp_pipe_read_descriptor(c->cl_pipe, c->cl_desc);
    return true;
}

// Locked: one half of a round finished at @t1 (before the echo's stamp
// was checked: with --device cuda that is a copy, not part of the trip).
static void
bp_cl_part(bp_client *c, uint64_t t1)
{
    if (--c->cl_pending != 0) {
        return;
    }
    c->cl_round++;
    if (c->cl_round == c->cl_warm) {
        c->cl_tstart = t1;
    }
    if (c->cl_round > c->cl_warm) {
        c->cl_lat[c->cl_nlat++] = (double)(t1 - c->cl_t0) / 1e3;
    }
    uint64_t measured = c->cl_nlat;
    bool more =
        measured < c->cl_min_iters ||
        (measured < c->cl_max_iters &&
         (c->cl_round <= c->cl_warm || t1 - c->cl_tstart < c->cl_budget_ns));
    if (more) {
        bp_cl_round(c);
    } else {
        bt_sync_done(&c->cl_sync);
    }
}

// Locked: keep cl_window writes in flight until cl_count are issued; the
// last one asks for an ack.
static void
bp_cl_pump(bp_client *c)
{
    while (c->cl_issued < c->cl_count &&
           c->cl_issued - c->cl_completed < c->cl_window) {
        bool last = c->cl_issued + 1 == c->cl_count;
        bool bibw = c->cl_mode == BP_MODE_BIBW;
        unsigned slot = (unsigned)(c->cl_issued % c->cl_window);
        c->cl_issued++;
        bp_cl_write(c, slot, bibw ? (last ? 'a' : 'b') : (last ? 'A' : 'S'),
                    c->cl_size);
        if (last && !bibw) {
            tp_pipe_read_descriptor(c->cl_pipe, c->cl_desc);
        }
    }
}

// Locked. Stream and quit end once the ack arrived and every write
// completed (the next measurement reuses the write aios).
static void
bp_cl_check_done(bp_client *c)
{
    if (c->cl_acked && c->cl_completed == c->cl_issued) {
        if (c->cl_mode == BP_MODE_BIBW) {
            c->cl_s_t1 = tp__now_ns();
        }
        bt_sync_done(&c->cl_sync);
    }
}

static void
bp_cl_wr_cb(void *arg)
{
    bp_wslot *w = arg;
    bp_client *c = w->ws_cl;
    bp_bump(&c->cl_sync);
    if (tp_aio_error(w->ws_aio) != NULL) {
        bp_cl_fail(c, "write", w->ws_aio);
        return;
    }
    tp__mtx_lock(&c->cl_mtx);
    if (c->cl_mode == BP_MODE_PING) {
        bp_cl_part(c, tp__now_ns());
    } else {
        c->cl_completed++;
        if (c->cl_mode == BP_MODE_STREAM || c->cl_mode == BP_MODE_BIBW) {
            bp_cl_pump(c);
        }
        bp_cl_check_done(c);
    }
    tp__mtx_unlock(&c->cl_mtx);
}

static void
bp_cl_desc_cb(void *arg)
{
    bp_client *c = arg;
    bp_bump(&c->cl_sync);
    if (tp_aio_error(c->cl_desc) != NULL) {
        bp_cl_fail(c, "read descriptor", c->cl_desc);
        return;
    }
    tp_message *m = tp_aio_get_output(c->cl_desc, 0);
    tp__mtx_lock(&c->cl_mtx);
    bool bibw = c->cl_mode == BP_MODE_BIBW;
    char want = c->cl_mode == BP_MODE_PING ? 'R' : bibw ? 'b' : 'K';
    char op = m->metadata_len == 1 ? *(const char *)m->metadata : '?';
    if (bibw && op == 'a') {
        want = 'a'; // the server's last message
    }
    c->cl_rop = op;
    uint32_t nt = want != 'K' ? 1 : 0;
    uint32_t np = want != 'K' ? c->cl_opts->bo_npayloads : 0;
    bool ok = op == want && m->ntensors == nt && m->npayloads == np &&
              (nt == 0 || m->tensors[0].len == c->cl_size);
    for (uint32_t i = 0; ok && i < np; i++) {
        ok = m->payloads[i].len == c->cl_opts->bo_payload_size;
    }
    // The server's tensors are on the destination device: a server given
    // another --device (across hosts) is found here.
    tp_device dst = c->cl_opts->bo_dst;
    if (ok && nt == 1 &&
        (m->tensors[0].device.type != dst.type ||
         (dst.type == TP_DEVICE_CUDA &&
          m->tensors[0].device.index != dst.index))) {
        char got[16], want_dev[16];
        bp_dev_name(m->tensors[0].device, got, sizeof(got));
        bp_dev_name(dst, want_dev, sizeof(want_dev));
        tp__mtx_unlock(&c->cl_mtx);
        bt_sync_fail(&c->cl_sync,
                     "the server's tensor is on %s, --device says %s (give "
                     "both sides the same --device)",
                     got, want_dev);
        tp_message_destroy(m);
        return;
    }
    if (!ok) {
        tp__mtx_unlock(&c->cl_mtx);
        bt_sync_fail(&c->cl_sync,
                     "unexpected reply (wanted '%c', got metadata %llu "
                     "bytes '%c', %u payloads, %u tensors)",
                     want, (unsigned long long)m->metadata_len, op,
                     m->npayloads, m->ntensors);
        tp_message_destroy(m);
        return;
    }
    if (nt == 1) {
        m->tensors[0].data = c->cl_rbuf;
        m->tensors[0].device = c->cl_opts->bo_src;
    }
    for (uint32_t i = 0; i < np; i++) {
        m->payloads[i].data = c->cl_rpay + i * c->cl_opts->bo_payload_size;
    }
    c->cl_rmsg = m;
    tp_pipe_read(c->cl_pipe, m, c->cl_rd);
    tp__mtx_unlock(&c->cl_mtx);
}

static void
bp_cl_rd_cb(void *arg)
{
    bp_client *c = arg;
    uint64_t t1 = tp__now_ns();
    bp_bump(&c->cl_sync);
    if (tp_aio_error(c->cl_rd) != NULL) {
        bp_cl_fail(c, "read", c->cl_rd);
        return;
    }
    tp__mtx_lock(&c->cl_mtx);
    tp_message_destroy(c->cl_rmsg);
    c->cl_rmsg = NULL;
    if (c->cl_mode == BP_MODE_PING) {
        uint64_t v = 0x1000 + c->cl_round;
        bool stamped = false;
        char why[512];
        if (!bp_stamp_check(c->cl_opts->bo_src, c->cl_rbuf, c->cl_size, v,
                            &stamped, why, sizeof(why))) {
            tp__mtx_unlock(&c->cl_mtx);
            bt_sync_fail(&c->cl_sync, "the echo of round %llu: %s",
                         (unsigned long long)c->cl_round, why);
            return;
        }
        if (!stamped) {
            tp__mtx_unlock(&c->cl_mtx);
            bt_sync_fail(&c->cl_sync,
                         "the echo of round %llu does not carry its stamp",
                         (unsigned long long)c->cl_round);
            return;
        }
        bp_cl_part(c, t1);
    } else if (c->cl_mode == BP_MODE_BIBW && c->cl_rop == 'b') {
        // The server's stream: sink it, read the next one.
        tp_pipe_read_descriptor(c->cl_pipe, c->cl_desc);
    } else {
        if (c->cl_mode == BP_MODE_STREAM) {
            c->cl_s_t1 = tp__now_ns();
        }
        c->cl_acked = true;
        bp_cl_check_done(c);
    }
    tp__mtx_unlock(&c->cl_mtx);
}

// ---- one (combination, repetition) -----------------------------------------

// Waits for the measurement; on failure writes "<what>: <why>" to pr_err.
static bool
bp_wait(bp_run *r, bp_client *c, const char *what, uint64_t size)
{
    return bench_wait(&c->cl_sync, &r->pr_opts->bo_com, what, size, r->pr_err,
                      sizeof(r->pr_err));
}

static void
bp_start(bp_client *c, int mode)
{
    bt_sync_reset(&c->cl_sync);
    tp__mtx_lock(&c->cl_mtx);
    c->cl_mode = mode;
    if (mode == BP_MODE_PING) {
        c->cl_round = 0;
        c->cl_nlat = 0;
        bp_cl_round(c);
    } else if (mode == BP_MODE_STREAM || mode == BP_MODE_BIBW) {
        // The server checks the stamp of the last message (each carries
        // it: one source buffer).
        char why[512];
        if (!bp_stamp_put(c->cl_opts->bo_src, c->cl_sbuf, c->cl_size,
                          BP_STREAM_STAMP, why, sizeof(why))) {
            tp__mtx_unlock(&c->cl_mtx);
            bt_sync_fail(&c->cl_sync, "stream: %s", why);
            return;
        }
        c->cl_issued = c->cl_completed = 0;
        c->cl_acked = false;
        c->cl_s_t0 = tp__now_ns();
        if (mode == BP_MODE_BIBW) {
            // The server answers each message with one of its own.
            tp_pipe_read_descriptor(c->cl_pipe, c->cl_desc);
        }
        bp_cl_pump(c);
    } else {
        c->cl_issued = 1;
        c->cl_completed = 0;
        c->cl_acked = false;
        bp_cl_write(c, 0, 'Q', 0);
        tp_pipe_read_descriptor(c->cl_pipe, c->cl_desc);
    }
    tp__mtx_unlock(&c->cl_mtx);
}

static bool
bp_pingpong(bp_run *r, bp_client *c, uint64_t size, bench_cell *cell)
{
    const bp_opts *o = r->pr_opts;
    c->cl_size = size;
    c->cl_warm = size >= (16u << 20) ? 2 : 20;
    c->cl_min_iters = 10;
    c->cl_max_iters = o->bo_com.bo_iters;
    c->cl_budget_ns = (uint64_t)(o->bo_com.bo_budget * 1e9);
    bp_start(c, BP_MODE_PING);
    if (!bp_wait(r, c, "pingpong", size)) {
        return false;
    }
    bench_cell_pingpong(&o->bo_com, r->pr_combo->bc_label, size, c->cl_lat,
                        (size_t)c->cl_nlat, cell);
    return true;
}

// A stream run of tool_stream_measure.
typedef struct bp_stream_ctx {
    bp_run *ss_run;
    bp_client *ss_client;
    uint64_t ss_size;
} bp_stream_ctx;

static bool
bp_stream_once(void *arg, uint64_t count, double *secs_p)
{
    bp_stream_ctx *s = arg;
    bp_client *c = s->ss_client;
    c->cl_size = s->ss_size;
    c->cl_count = count;
    c->cl_window = s->ss_run->pr_opts->bo_com.bo_window;
    bool bibw = s->ss_run->pr_opts->bo_bibw;
    bp_start(c, bibw ? BP_MODE_BIBW : BP_MODE_STREAM);
    if (!bp_wait(s->ss_run, c, bibw ? "bibw" : "stream", s->ss_size)) {
        return false;
    }
    *secs_p = (double)(c->cl_s_t1 - c->cl_s_t0) / 1e9;
    return true;
}

// As bench transport (tool_stream_measure): an untimed warm-up of 2W
// messages estimates the rate; the measured run then fills the budget.
static bool
bp_stream(bp_run *r, bp_client *c, uint64_t size, bench_cell *cell)
{
    const bp_opts *o = r->pr_opts;
    bp_stream_ctx s = {.ss_run = r, .ss_client = c, .ss_size = size};
    // bibw: both directions' bytes.
    double bytes =
        (o->bo_bibw ? 2.0 : 1.0) *
        ((double)size + (double)o->bo_npayloads * (double)o->bo_payload_size);
    return bench_stream(&o->bo_com, r->pr_combo->bc_label, size, bytes,
                        bp_stream_once, &s, cell);
}

// Connects, checks the negotiated combination, measures every size and
// test. Returns BP_SKIP (with pr_err) when the pipe did not negotiate the
// combination asked for.
static bp_outcome
bp_client_run(bp_run *r, const char *url, bench_cell *cells)
{
    const bp_opts *o = r->pr_opts;
    const bp_combo *cb = r->pr_combo;
    static bp_client cl; // large: keep it off the stack
    tp_context *ctx = NULL;
    tp_pipe *p = NULL;
    tp_error *err = NULL;
    bp_outcome out = BP_FAIL;
    bool cl_inited = false;
    if (!bp_context(o, cb, "bench-client", &ctx, r->pr_err,
                    sizeof(r->pr_err))) {
        return BP_SKIP;
    }
    if (tp_context_connect(ctx, url, &p, &err) != TP_OK) {
        snprintf(r->pr_err, sizeof(r->pr_err), "connect to %s: %s", url,
                 tp_error_message(err));
        tp_error_unref(err);
        out = BP_SKIP;
        goto done;
    }
    if (tp_pipe_wait_ready(p, (int64_t)(o->bo_com.bo_stall_s * 1000), &err) !=
        TP_OK) {
        char *rep = tp_context_report(ctx);
        bp_flatten(rep);
        snprintf(r->pr_err, sizeof(r->pr_err),
                 "handshake with %s failed: %s (context: %s)", url,
                 tp_error_message(err), rep ? rep : "no report");
        free(rep);
        tp_error_unref(err);
        out = BP_SKIP;
        goto done;
    }
    {
        const char *tr = tp_pipe_transport(p), *ch = tp_pipe_channel(p);
        tr = tr ? tr : "?";
        ch = ch ? ch : "?";
        snprintf(r->pr_transport, sizeof(r->pr_transport), "%s", tr);
        const char *dch = tp_pipe_device_channel(p);
        snprintf(r->pr_dchannel, sizeof(r->pr_dchannel), "%s", dch ? dch : "");
        bool tr_ok = *cb->bc_expect != '\0'
                         ? strcmp(cb->bc_expect, tr) == 0
                         : strstr(cb->bc_transports, tr) != NULL;
        if (!tr_ok || strcmp(ch, cb->bc_channel) != 0) {
            char *rep = tp_pipe_report(p);
            bp_flatten(rep);
            snprintf(r->pr_err, sizeof(r->pr_err), "the pipe chose %s+%s (%s)",
                     tr, ch, rep ? rep : "no report");
            free(rep);
            out = BP_SKIP;
            goto done;
        }
        tool_verbose(o->bo_com.bo_verbose, "bench pipe",
                     "%s: connected to %s over %s+%s", cb->bc_label, url, tr,
                     ch);
    }
    cl_inited = true;
    if (!bp_client_init(&cl, o, p, r->pr_err, sizeof(r->pr_err))) {
        goto done;
    }
    for (size_t i = 0; i < o->bo_com.bo_nsizes; i++) {
        uint64_t size = o->bo_com.bo_sizes[i];
        if (o->bo_com.bo_pingpong && !bp_pingpong(r, &cl, size, &cells[i])) {
            goto done;
        }
        if (o->bo_com.bo_stream &&
            !bp_stream(r, &cl, size, &cells[o->bo_com.bo_nsizes + i])) {
            goto done;
        }
    }
    bp_start(&cl, BP_MODE_QUIT);
    if (!bp_wait(r, &cl, "quit", 0)) {
        goto done;
    }
    out = BP_OK;
done:
    if (out == BP_FAIL) {
        // A pipe that does not complete its operations on close must not
        // hang the tool.
        tool_install_teardown_alarm("bench pipe",
                                    (unsigned)o->bo_com.bo_stall_s + 10);
    }
    if (p != NULL) {
        tp_pipe_close(p);
    }
    if (cl_inited) {
        bp_client_fini(&cl);
    }
    tp_pipe_unref(p);
    tp_context_destroy(ctx);
    return out;
}

// Both contexts in this process (xth).
static bp_outcome
bp_run_inproc(bp_run *r, bench_cell *cells)
{
    const bp_opts *o = r->pr_opts;
    static bp_server srv;
    tp_context *sctx = NULL;
    char url[512];
    bp_outcome out = bp_server_setup(o, r->pr_combo, &sctx, &srv, url,
                                     sizeof(url), r->pr_err, sizeof(r->pr_err));
    if (out == BP_OK) {
        out = bp_client_run(r, url, cells);
    }
    if (out == BP_OK) {
        int rc = bt_sync_wait(&srv.sv_sync, bench_stall_ns(&o->bo_com));
        if (rc != 0) {
            snprintf(r->pr_err, sizeof(r->pr_err), "server: %s",
                     rc == -2 ? "no progress" : srv.sv_sync.bs_msg);
            out = BP_FAIL;
        }
    }
    if (out == BP_FAIL) {
        tool_install_teardown_alarm("bench pipe",
                                    (unsigned)o->bo_com.bo_stall_s + 10);
    }
    bp_server_teardown(sctx, &srv);
    alarm(0);
    return out;
}

bp_outcome
bp_run_remote(bp_run *r, const char *url, bench_cell *cells)
{
    bp_outcome out = bp_client_run(r, url, cells);
    alarm(0);
    return out;
}

bp_outcome
bp_run_rep(bp_run *r, bench_cell *cells)
{
    const bp_opts *o = r->pr_opts;
    if (r->pr_combo->bc_inproc) {
        return bp_run_inproc(r, cells);
    }
    char url[1600];
    pid_t pid;
    bench_outcome so =
        bench_server_start(&o->bo_com, bp_server_child, r, url, sizeof(url),
                           &pid, r->pr_err, sizeof(r->pr_err));
    if (so != BENCH_OK) {
        return so == BENCH_SKIP ? BP_SKIP : BP_FAIL;
    }
    tool_verbose(o->bo_com.bo_verbose, "bench pipe",
                 "%s: server %d listens on %s", r->pr_combo->bc_label, (int)pid,
                 url);
    bp_outcome out = bp_client_run(r, url, cells);
    // After a skip or a failure the server has nothing left to do.
    if (!bench_reap_server(pid, out == BP_OK, r->pr_err, sizeof(r->pr_err)) &&
        out == BP_OK) {
        out = BP_FAIL;
    }
    alarm(0);
    return out;
}
