// SPDX-License-Identifier: Apache-2.0
// bench_pipe_server.c - `tpipe bench pipe`'s server: echoes pings,
// sinks streams, acks (bench_pipe.c describes the messages).

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

// ---- server: echo and sink -------------------------------------------------

static const char bp_md_echo = 'R';
static const char bp_md_ack = 'K';
static const char bp_md_bibw = 'b';
static const char bp_md_bibw_last = 'a';

void
bp_bump(bt_sync *s)
{
    atomic_fetch_add_explicit(&s->bs_progress, 1, memory_order_relaxed);
}

static void bp_srv_accept_cb(void *arg);
static void bp_srv_desc_cb(void *arg);
static void bp_srv_rd_cb(void *arg);
static void bp_srv_wr_cb(void *arg);

static void
bp_server_fini(bp_server *s)
{
    tp_aio_destroy(s->sv_accept);
    tp_aio_destroy(s->sv_desc);
    for (unsigned i = 0; s->sv_slots != NULL && i < s->sv_nslots; i++) {
        bp_slot *sl = &s->sv_slots[i];
        tp_aio_destroy(sl->ss_rd);
        tp_aio_destroy(sl->ss_wr);
        tp_message_destroy(sl->ss_msg);
        free(sl->ss_out_p);
        bp_buf_free(s->sv_opts->bo_dst, sl->ss_buf);
        free(sl->ss_pay);
    }
    free(s->sv_slots);
    tp_pipe_unref(s->sv_pipe);
    bt_sync_fini(&s->sv_sync);
    memset(s, 0, sizeof(*s));
}

// W+1 slots of the largest size, on the destination device. Returns
// false with @why set.
static bool
bp_server_init(bp_server *s, const bp_opts *o, tp_pipe_listener *l, char *why,
               size_t why_len)
{
    memset(s, 0, sizeof(*s));
    bt_sync_init(&s->sv_sync);
    s->sv_opts = o;
    s->sv_listener = l;
    s->sv_nslots = o->bo_com.bo_window + 1;
    s->sv_slots = calloc(s->sv_nslots, sizeof(bp_slot));
    int64_t tmo = (int64_t)(o->bo_com.bo_stall_s * 2000);
    snprintf(why, why_len, "out of memory for %u buffers of %llu bytes",
             s->sv_nslots, (unsigned long long)o->bo_com.bo_max_size);
    if (s->sv_slots == NULL ||
        tp_aio_create(bp_srv_accept_cb, s, &s->sv_accept) != TP_OK ||
        tp_aio_create(bp_srv_desc_cb, s, &s->sv_desc) != TP_OK) {
        return false;
    }
    tp_aio_set_timeout(s->sv_accept, tmo);
    for (unsigned i = 0; i < s->sv_nslots; i++) {
        bp_slot *sl = &s->sv_slots[i];
        sl->ss_srv = s;
        if (tp_aio_create(bp_srv_rd_cb, sl, &sl->ss_rd) != TP_OK ||
            tp_aio_create(bp_srv_wr_cb, sl, &sl->ss_wr) != TP_OK) {
            return false;
        }
        tp_aio_set_timeout(sl->ss_rd, tmo);
        tp_aio_set_timeout(sl->ss_wr, tmo);
        sl->ss_buf =
            bp_buf_alloc(o->bo_dst, o->bo_com.bo_max_size, why, why_len);
        if (sl->ss_buf == NULL) {
            return false;
        }
        if (o->bo_npayloads > 0) {
            sl->ss_out_p = calloc(o->bo_npayloads, sizeof(tp_msg_buf));
            sl->ss_pay = bt_buf_alloc(o->bo_npayloads * o->bo_payload_size);
            if (sl->ss_out_p == NULL || sl->ss_pay == NULL) {
                return false;
            }
        }
    }
    return true;
}

static void
bp_srv_fail(bp_server *s, const char *what, const tp_aio *aio)
{
    bt_sync_fail(&s->sv_sync, "server %s: %s", what,
                 tp_error_message(tp_aio_error(aio)));
}

// Loop thread: read the next descriptor if a slot is free for it.
static void
bp_srv_post_desc(bp_server *s)
{
    if (s->sv_desc_posted || s->sv_quitting ||
        s->sv_slots[s->sv_head % s->sv_nslots].ss_busy ||
        bt_sync_failed(&s->sv_sync)) {
        return;
    }
    s->sv_desc_posted = true;
    tp_pipe_read_descriptor(s->sv_pipe, s->sv_desc);
}

static void
bp_srv_accept_cb(void *arg)
{
    bp_server *s = arg;
    bp_bump(&s->sv_sync);
    if (tp_aio_error(s->sv_accept) != NULL) {
        bp_srv_fail(s, "accept", s->sv_accept);
        return;
    }
    s->sv_pipe = tp_aio_get_output(s->sv_accept, 0);
    bp_srv_post_desc(s);
}

static void
bp_srv_desc_cb(void *arg)
{
    bp_server *s = arg;
    const bp_opts *o = s->sv_opts;
    bp_bump(&s->sv_sync);
    s->sv_desc_posted = false;
    if (tp_aio_error(s->sv_desc) != NULL) {
        bp_srv_fail(s, "read descriptor", s->sv_desc);
        return;
    }
    tp_message *m = tp_aio_get_output(s->sv_desc, 0);
    char op = m->metadata_len == 1 ? *(const char *)m->metadata : '?';
    bool ok = strchr("PSAQba", op) != NULL && m->ntensors <= 1 &&
              m->npayloads <= o->bo_npayloads;
    for (uint32_t i = 0; ok && i < m->ntensors; i++) {
        ok = m->tensors[i].len <= o->bo_com.bo_max_size;
    }
    for (uint32_t i = 0; ok && i < m->npayloads; i++) {
        ok = m->payloads[i].len <= o->bo_payload_size;
    }
    if (!ok) {
        bt_sync_fail(&s->sv_sync,
                     "server: unexpected message (metadata %llu bytes, %u "
                     "payloads, %u tensors)",
                     (unsigned long long)m->metadata_len, m->npayloads,
                     m->ntensors);
        tp_message_destroy(m);
        return;
    }
    // The descriptor names the sender's device: the client's --device
    // must be ours (across hosts each side is given it).
    tp_device src = o->bo_src;
    if (m->ntensors == 1 && (m->tensors[0].device.type != src.type ||
                             (src.type == TP_DEVICE_CUDA &&
                              m->tensors[0].device.index != src.index))) {
        char got[16], want[16];
        bp_dev_name(m->tensors[0].device, got, sizeof(got));
        bp_dev_name(src, want, sizeof(want));
        bt_sync_fail(&s->sv_sync,
                     "server: the client's tensor is on %s, --device says %s "
                     "(give both sides the same --device)",
                     got, want);
        tp_message_destroy(m);
        return;
    }
    bp_slot *sl = &s->sv_slots[s->sv_head++ % s->sv_nslots];
    sl->ss_busy = true;
    sl->ss_op = op;
    sl->ss_msg = m;
    if (m->ntensors == 1) {
        m->tensors[0].data = sl->ss_buf;
        m->tensors[0].device = o->bo_dst;
    }
    for (uint32_t i = 0; i < m->npayloads; i++) {
        m->payloads[i].data = sl->ss_pay + i * o->bo_payload_size;
    }
    tp_pipe_read(s->sv_pipe, m, sl->ss_rd);
    if (op == 'Q') {
        s->sv_quitting = true;
    }
    bp_srv_post_desc(s);
}

static void
bp_srv_rd_cb(void *arg)
{
    bp_slot *sl = arg;
    bp_server *s = sl->ss_srv;
    bp_bump(&s->sv_sync);
    if (tp_aio_error(sl->ss_rd) != NULL) {
        bp_srv_fail(s, "read", sl->ss_rd);
        return;
    }
    tp_message *m = sl->ss_msg;
    sl->ss_msg = NULL;
    if ((sl->ss_op == 'A' || sl->ss_op == 'a') && m->ntensors == 1) {
        // The last stream message: its bytes arrived where they should.
        bool stamped = false;
        char why[512] = "does not carry its stamp";
        uint64_t len = m->tensors[0].len;
        if (!bp_stamp_check(s->sv_opts->bo_dst, sl->ss_buf, len,
                            BP_STREAM_STAMP, &stamped, why, sizeof(why)) ||
            !stamped) {
            bt_sync_fail(&s->sv_sync,
                         "server: the last stream message (%llu bytes): %s",
                         (unsigned long long)len, why);
            tp_message_destroy(m);
            return;
        }
    }
    if (sl->ss_op == 'S') {
        tp_message_destroy(m);
        sl->ss_busy = false;
        bp_srv_post_desc(s);
        return;
    }
    tp_message *out = &sl->ss_out;
    memset(out, 0, sizeof(*out));
    if (sl->ss_op == 'P' || sl->ss_op == 'b' || sl->ss_op == 'a') {
        // Echo the same bytes from the same (our own) buffers. bibw: the
        // client does not wait for them, so both directions stream.
        out->metadata = (void *)(sl->ss_op == 'P'   ? &bp_md_echo
                                 : sl->ss_op == 'b' ? &bp_md_bibw
                                                    : &bp_md_bibw_last);
        out->metadata_len = 1;
        if (m->ntensors == 1) {
            sl->ss_out_t = (tp_msg_buf){.data = sl->ss_buf,
                                        .len = m->tensors[0].len,
                                        .device = m->tensors[0].device};
            out->tensors = &sl->ss_out_t;
            out->ntensors = 1;
        }
        for (uint32_t i = 0; i < m->npayloads; i++) {
            sl->ss_out_p[i] = (tp_msg_buf){.data = m->payloads[i].data,
                                           .len = m->payloads[i].len,
                                           .device = m->payloads[i].device};
        }
        out->payloads = sl->ss_out_p;
        out->npayloads = m->npayloads;
    } else {
        out->metadata = (void *)&bp_md_ack;
        out->metadata_len = 1;
    }
    tp_message_destroy(m);
    tp_pipe_write(s->sv_pipe, out, sl->ss_wr);
}

static void
bp_srv_wr_cb(void *arg)
{
    bp_slot *sl = arg;
    bp_server *s = sl->ss_srv;
    bp_bump(&s->sv_sync);
    if (tp_aio_error(sl->ss_wr) != NULL) {
        bp_srv_fail(s,
                    sl->ss_op == 'P'          ? "echo"
                    : strchr("ba", sl->ss_op) ? "bibw write"
                                              : "ack",
                    sl->ss_wr);
        return;
    }
    sl->ss_busy = false;
    if (sl->ss_op == 'Q') {
        bt_sync_done(&s->sv_sync);
        return;
    }
    bp_srv_post_desc(s);
}

// A context for combination @c. Returns false with @why set.
bool
bp_context(const bp_opts *o, const bp_combo *c, const char *name,
           tp_context **ctx_p, char *why, size_t why_len)
{
    tp_context_options co;
    tp_context_options_init(&co);
    co.name = name;
    co.transports = c->bc_transports;
    co.channels = c->bc_channel;
    // CUDA tensors: the device channel beside the pipe's (--device-channel).
    char chans[128];
    if (o->bo_cuda && (o->bo_device_channel == NULL ||
                       strcmp(o->bo_device_channel, "none") != 0)) {
        char dev[96];
        if (o->bo_device_channel != NULL) {
            snprintf(dev, sizeof(dev), "%s", o->bo_device_channel);
        } else {
            tool_device_channels(dev, sizeof(dev));
        }
        snprintf(chans, sizeof(chans), "%s%s%s", c->bc_channel,
                 dev[0] ? "," : "", dev);
        co.channels = chans;
    }
    co.mpt_lanes = o->bo_lanes;
    tp_error *err = NULL;
    if (tp_context_create(&co, ctx_p, &err) != TP_OK) {
        snprintf(why, why_len, "context: %s", tp_error_message(err));
        tp_error_unref(err);
        *ctx_p = NULL;
        return false;
    }
    return true;
}

// The report as one line ("a; b; c"), for error messages.
void
bp_flatten(char *s)
{
    size_t n = s ? strlen(s) : 0;
    while (n > 0 && (s[n - 1] == '\n' || s[n - 1] == ' ')) {
        s[--n] = '\0';
    }
    for (char *p = s; p && *p; p++) {
        if (*p == '\n') {
            *p = ';';
        }
    }
}

// Creates the server's context and listener, allocates and starts
// accepting. On success writes the URL to dial into @url. On failure
// returns BP_SKIP (the combination is not available here) or BP_FAIL with
// @why set; whatever was created is left in *ctx_p / s for the caller to
// free.
bp_outcome
bp_server_setup(const bp_opts *o, const bp_combo *c, tp_context **ctx_p,
                bp_server *s, char *url, size_t url_len, char *why,
                size_t why_len)
{
    if (!bp_context(o, c, "bench-server", ctx_p, why, why_len)) {
        return BP_SKIP;
    }
    char bind[300];
    const char *tcp_url = "tcp://127.0.0.1:0";
    bool tcp = strstr(c->bc_transports, "tcp") != NULL;
    if (c->bc_remote) {
        // The client is on another host: the address --bind names, or the
        // library's default (a routable address of this host).
        tcp = tcp && o->bo_bind != NULL;
        snprintf(bind, sizeof(bind),
                 strchr(o->bo_bind ? o->bo_bind : "", ':') ? "tcp://[%s]:0"
                                                           : "tcp://%s:0",
                 o->bo_bind ? o->bo_bind : "");
        tcp_url = bind;
    }
    tp_pipe_listener *l = NULL;
    tp_error *err = NULL;
    // Both processes are on this host: tcp listens on loopback, as the
    // peers it is compared with do.
    if (tp_context_listen(*ctx_p, tcp ? &tcp_url : NULL, tcp ? 1 : 0, &l,
                          &err) != TP_OK) {
        snprintf(why, why_len, "listen: %s", tp_error_message(err));
        tp_error_unref(err);
        return BP_FAIL;
    }
    const char *addr = tp_pipe_listener_addr(l, c->bc_connect);
    if (addr == NULL) {
        char *rep = tp_context_report(*ctx_p);
        bp_flatten(rep);
        snprintf(why, why_len, "the server does not listen on %s (%s)",
                 c->bc_connect, rep ? rep : "no report");
        free(rep);
        tp_pipe_listener_destroy(l);
        return BP_SKIP;
    }
    if ((size_t)snprintf(url, url_len, "%s", addr) >= url_len) {
        snprintf(why, why_len, "listener URL too long");
        tp_pipe_listener_destroy(l);
        return BP_FAIL;
    }
    // Buffers before the client connects: touching them takes a while.
    if (!bp_server_init(s, o, l, why, why_len)) {
        return BP_FAIL;
    }
    tp_pipe_listener_accept(l, s->sv_accept);
    return BP_OK;
}

void
bp_server_teardown(tp_context *ctx, bp_server *s)
{
    if (s->sv_pipe != NULL) {
        tp_pipe_close(s->sv_pipe);
    }
    if (s->sv_listener != NULL) {
        tp_pipe_listener_destroy(s->sv_listener);
        s->sv_listener = NULL;
    }
    if (s->sv_opts != NULL) {
        bp_server_fini(s);
    }
    tp_context_destroy(ctx);
}

// The forked server: never returns.
void
bp_server_child(void *arg, int wfd)
{
    const bp_run *r = arg;
    const bp_opts *o = r->pr_opts;
    const bp_combo *c = r->pr_combo;
    static bp_server srv;
    tp_context *ctx = NULL;
    char url[512], why[1024];
    bp_outcome rc =
        bp_server_setup(o, c, &ctx, &srv, url, sizeof(url), why, sizeof(why));
    bool sent = bench_server_report(wfd,
                                    rc == BP_OK     ? BENCH_OK
                                    : rc == BP_SKIP ? BENCH_SKIP
                                                    : BENCH_FAIL,
                                    rc == BP_OK ? url : why);
    if (!sent || rc != BP_OK) {
        _exit(rc == BP_OK ? 1 : 0);
    }
    close(wfd);
    // The client drives; the server only notices a dead client (the pipe
    // fails) or one that stopped talking.
    uint64_t stall = (uint64_t)(o->bo_com.bo_stall_s * 2e9);
    int wrc = bt_sync_wait(&srv.sv_sync, stall);
    if (wrc != 0) {
        fprintf(stderr, "tpipe: bench pipe server (%s): %s\n", c->bc_label,
                wrc == -2 ? "no progress, giving up" : srv.sv_sync.bs_msg);
        _exit(1);
    }
    // Orderly teardown: it exercises close paths too.
    bp_server_teardown(ctx, &srv);
    _exit(0);
}
