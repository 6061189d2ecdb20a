// SPDX-License-Identifier: Apache-2.0
// ibv_test.c - the ibv transport's own cases: the ring and credit logic
// (transport/ibv/proto.c) on its own, the registration cache, and
// connections on the in-memory verbs fake (TP_IBV_FAKE=1, set by CTest):
// rings wrapping many times, a peer closing mid-message, a peer writing an
// out-of-range segment; the tunables (device choice by name, ring size on
// the wire and mismatched between ends, the ring pool's bound). The conformance
// suite runs on the fake too (conformance_ibv_fake).

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/aio.h"
#include "core/config.h"
#include "core/loop.h"
#include "ibv_fake.h"
#include "tp_test.h"
#include "tp_test_op.h"
#include "transport/ibv/ibv_impl.h"
#include "transport/ibv/proto.h"
#include "transport/ibv/verbs.h"
#include "transport/transport.h"

// ---- proto -----------------------------------------------------------------

// A sender's write, as the receiver sees it: the immediate.
static void
deliver(tp_ibv_proto *rx, uint32_t len)
{
    char why[160];
    uint32_t n = 0;
    TP_CHECK_EQ(tp__ibv_proto_on_imm(rx, len, &n, why, sizeof(why)), TP_OK);
    TP_CHECK_EQ(n, len);
}

static void
ack(tp_ibv_proto *from, tp_ibv_proto *to)
{
    uint32_t imm = tp__ibv_proto_ack_take(from);
    TP_CHECK(imm & TP_IBV_IMM_ACK);
    char why[160];
    uint32_t n = 1;
    TP_CHECK_EQ(tp__ibv_proto_on_imm(to, imm, &n, why, sizeof(why)), TP_OK);
    TP_CHECK_EQ(n, 0);
}

// Writes split at the ring's end and continue at offset 0; the reader
// sees the bytes in order across the wrap.
static void
proto_wrap_around(void)
{
    tp_ibv_proto a, b; // a sends to b
    TP_CHECK_OK(tp__ibv_proto_init(&a, 100, 100, 4, 64), NULL);
    TP_CHECK_OK(tp__ibv_proto_init(&b, 100, 100, 4, 64), NULL);
    uint64_t off;
    uint32_t len;
    TP_CHECK(tp__ibv_proto_tx_next(&a, 80, &off, &len));
    TP_CHECK_EQ(off, 0);
    TP_CHECK_EQ(len, 64); // one segment at most
    tp__ibv_proto_tx_commit(&a, len);
    deliver(&b, len);
    TP_CHECK_EQ(tp__ibv_proto_rx_avail(&b, &off), 64);
    tp__ibv_proto_rx_consume(&b, 64);
    ack(&b, &a);
    // 80 more: 36 up to the end, then 44 from offset 0.
    TP_CHECK(tp__ibv_proto_tx_next(&a, 80, &off, &len));
    TP_CHECK_EQ(off, 64);
    TP_CHECK_EQ(len, 36);
    tp__ibv_proto_tx_commit(&a, len);
    deliver(&b, len);
    TP_CHECK(tp__ibv_proto_tx_next(&a, 44, &off, &len));
    TP_CHECK_EQ(off, 0);
    TP_CHECK_EQ(len, 44);
    tp__ibv_proto_tx_commit(&a, len);
    deliver(&b, len);
    TP_CHECK_EQ(tp__ibv_proto_rx_avail(&b, &off), 36);
    TP_CHECK_EQ(off, 64);
    tp__ibv_proto_rx_consume(&b, 36);
    TP_CHECK_EQ(tp__ibv_proto_rx_avail(&b, &off), 44);
    TP_CHECK_EQ(off, 0);
    tp__ibv_proto_rx_consume(&b, 44);
    ack(&b, &a);
    TP_CHECK_EQ(a.p_tx_head - a.p_tx_tail, 0);
    TP_CHECK_EQ(a.p_tx_nsegs, 0);
    tp__ibv_proto_fini(&a);
    tp__ibv_proto_fini(&b);
}

// No credit when the peer's ring is full or max_segs writes are unacked;
// an ack gives it back.
static void
proto_credits_exhausted_then_returned(void)
{
    tp_ibv_proto a, b;
    uint64_t off;
    uint32_t len;
    // Segments run out first.
    TP_CHECK_OK(tp__ibv_proto_init(&a, 1000, 1000, 2, 10), NULL);
    TP_CHECK_OK(tp__ibv_proto_init(&b, 1000, 1000, 2, 10), NULL);
    for (int i = 0; i < 2; i++) {
        TP_CHECK(tp__ibv_proto_tx_next(&a, 10, &off, &len));
        tp__ibv_proto_tx_commit(&a, len);
        deliver(&b, len);
    }
    TP_CHECK(!tp__ibv_proto_tx_next(&a, 10, &off, &len));
    // A half-read segment is not acked yet.
    tp__ibv_proto_rx_consume(&b, 5);
    TP_CHECK_EQ(tp__ibv_proto_ack_take(&b), 0);
    tp__ibv_proto_rx_consume(&b, 5);
    // One of two consumed, data still waiting: below the threshold (1 of
    // max 2 is half: acked).
    ack(&b, &a);
    TP_CHECK(tp__ibv_proto_tx_next(&a, 10, &off, &len));
    tp__ibv_proto_fini(&a);
    tp__ibv_proto_fini(&b);
    // Bytes run out first.
    TP_CHECK_OK(tp__ibv_proto_init(&a, 100, 100, 8, 100), NULL);
    TP_CHECK_OK(tp__ibv_proto_init(&b, 100, 100, 8, 100), NULL);
    TP_CHECK(tp__ibv_proto_tx_next(&a, 250, &off, &len));
    TP_CHECK_EQ(len, 100);
    tp__ibv_proto_tx_commit(&a, len);
    deliver(&b, len);
    TP_CHECK(!tp__ibv_proto_tx_next(&a, 150, &off, &len));
    // A short read frees nothing until its segment is wholly read.
    tp__ibv_proto_rx_consume(&b, 60);
    TP_CHECK_EQ(tp__ibv_proto_ack_take(&b), 0);
    TP_CHECK(!tp__ibv_proto_tx_next(&a, 150, &off, &len));
    tp__ibv_proto_rx_consume(&b, 40);
    ack(&b, &a);
    TP_CHECK(tp__ibv_proto_tx_next(&a, 150, &off, &len));
    TP_CHECK_EQ(len, 100);
    tp__ibv_proto_fini(&a);
    tp__ibv_proto_fini(&b);
}

// A write larger than the free space goes out short (what fits), and the
// rest after the ack; the receiver sees one stream.
static void
proto_short_write(void)
{
    tp_ibv_proto a, b;
    TP_CHECK_OK(tp__ibv_proto_init(&a, 100, 100, 8, 100), NULL);
    TP_CHECK_OK(tp__ibv_proto_init(&b, 100, 100, 8, 100), NULL);
    uint64_t off;
    uint32_t len;
    TP_CHECK(tp__ibv_proto_tx_next(&a, 60, &off, &len));
    TP_CHECK_EQ(len, 60);
    tp__ibv_proto_tx_commit(&a, len);
    deliver(&b, len);
    // 80 wanted, 40 free: a short write of 40 at offset 60.
    TP_CHECK(tp__ibv_proto_tx_next(&a, 80, &off, &len));
    TP_CHECK_EQ(off, 60);
    TP_CHECK_EQ(len, 40);
    tp__ibv_proto_tx_commit(&a, len);
    deliver(&b, len);
    TP_CHECK(!tp__ibv_proto_tx_next(&a, 40, &off, &len));
    TP_CHECK_EQ(tp__ibv_proto_rx_avail(&b, &off), 100);
    tp__ibv_proto_rx_consume(&b, 100);
    ack(&b, &a);
    // The remaining 40 at offset 0.
    TP_CHECK(tp__ibv_proto_tx_next(&a, 40, &off, &len));
    TP_CHECK_EQ(off, 0);
    TP_CHECK_EQ(len, 40);
    tp__ibv_proto_fini(&a);
    tp__ibv_proto_fini(&b);
}

// What a peer could not have sent is a protocol error, with a reason.
static void
proto_malformed(void)
{
    tp_ibv_proto b;
    TP_CHECK_OK(tp__ibv_proto_init(&b, 100, 100, 2, 64), NULL);
    char why[160];
    uint32_t n;
    TP_CHECK_EQ(tp__ibv_proto_on_imm(&b, 0, &n, why, sizeof(why)), TP_EPROTO);
    TP_CHECK_STR_CONTAINS(why, "empty");
    TP_CHECK_EQ(tp__ibv_proto_on_imm(&b, 101, &n, why, sizeof(why)), TP_EPROTO);
    TP_CHECK_STR_CONTAINS(why, "free");
    TP_CHECK_EQ(
        tp__ibv_proto_on_imm(&b, TP_IBV_IMM_ACK | 1, &n, why, sizeof(why)),
        TP_EPROTO);
    TP_CHECK_STR_CONTAINS(why, "in flight");
    // 64 at offset 0, read; then 50 at offset 64 would cross the end.
    deliver(&b, 64);
    tp__ibv_proto_rx_consume(&b, 64);
    TP_CHECK_EQ(tp__ibv_proto_on_imm(&b, 50, &n, why, sizeof(why)), TP_EPROTO);
    TP_CHECK_STR_CONTAINS(why, "past the end");
    // More unacked segments than allowed.
    deliver(&b, 10);
    TP_CHECK_EQ(tp__ibv_proto_on_imm(&b, 10, &n, why, sizeof(why)), TP_EPROTO);
    TP_CHECK_STR_CONTAINS(why, "unacknowledged");
    tp__ibv_proto_fini(&b);
    TP_CHECK_EQ(tp__ibv_proto_init(&b, 0, 100, 2, 64), TP_EINVAL);
}

// ---- registration cache (on the fake) --------------------------------------

static void
mr_cache_reuses(void)
{
    const tp_ibv_verbs *v = &tp__ibv_verbs_fake;
    tp_config cfg;
    tp_error *err = NULL;
    TP_CHECK_OK(tp__config_load(&cfg, &err), err);
    tp_ibv_dev *dev;
    char domain[64];
    TP_CHECK_OK(v->dev_open(&cfg, &dev, domain, sizeof(domain), &err), err);
    void *buf;
    TP_CHECK_OK(v->buf_alloc(dev, 1 << 16, &buf, &err), err);
    tp_ibv_mr_cache mc;
    tp__ibv_mr_cache_init(&mc, v, dev);
    tp_ibv_fake_stats s0, s1;
    tp__ibv_fake_stats(&s0);
    const tp_ibv_mr *m1, *m2, *m3;
    TP_CHECK_OK(tp__ibv_mr_get(&mc, buf, 1 << 16, true, &m1, &err), err);
    TP_CHECK_OK(tp__ibv_mr_get(&mc, (char *)buf + 100, 1000, true, &m2, &err),
                err);
    TP_CHECK(m1 == m2);
    // Other access: a registration of its own.
    TP_CHECK_OK(tp__ibv_mr_get(&mc, buf, 10, false, &m3, &err), err);
    TP_CHECK(m3 != m1);
    tp__ibv_fake_stats(&s1);
    TP_CHECK_EQ(s1.fs_reg_mr - s0.fs_reg_mr, 2);
    TP_CHECK_EQ(mc.mc_hits, 1);
    tp__ibv_mr_put(&mc, m1);
    tp__ibv_mr_put(&mc, m3);
    tp__ibv_fake_stats(&s1);
    TP_CHECK_EQ(s1.fs_dereg_mr - s0.fs_dereg_mr, 1);
    tp__ibv_mr_put(&mc, m2);
    tp__ibv_fake_stats(&s1);
    TP_CHECK_EQ(s1.fs_dereg_mr - s0.fs_dereg_mr, 2);
    tp__ibv_mr_cache_fini(&mc);
    v->buf_free(dev, buf, 1 << 16);
    v->dev_close(dev);
}

// ---- connections on the fake -----------------------------------------------

typedef struct fixture {
    tp_config cfg;
    tp_loop *loop;
    tp_transport *t;
    tp_listener *l;
    tp_conn *c, *s;
} fixture;

static void
need_fake(void)
{
    if (tp__ibv_verbs() != &tp__ibv_verbs_fake) {
        tp_test_skip("needs TP_IBV_FAKE=1 (the in-memory verbs fake)");
    }
}

static void fx_pair(fixture *fx);

// A connected pair on one transport; @sets: tunable name, value, ...,
// NULL, applied over the environment's.
static void
fx_init_with(fixture *fx, const char *const *sets)
{
    tp_error *err = NULL;
    memset(fx, 0, sizeof(*fx));
    need_fake();
    TP_CHECK_OK(tp__config_load(&fx->cfg, &err), err);
    for (size_t i = 0; sets != NULL && sets[i] != NULL; i += 2) {
        TP_CHECK_OK(tp__config_set(&fx->cfg, sets[i], sets[i + 1], &err), err);
    }
    TP_CHECK_OK(tp__loop_create(&fx->cfg, "ibvt", &fx->loop, &err), err);
    TP_CHECK_OK(tp__transport_create("ibv", fx->loop, &fx->cfg, &fx->t, &err),
                err);
    TP_CHECK_OK(tp__transport_listen(fx->t, "ibv://127.0.0.1:0", &fx->l, &err),
                err);
    fx_pair(fx);
}

static void
fx_init(fixture *fx)
{
    fx_init_with(fx, NULL);
}

// A new connected pair (fx->c, fx->s) on fx->l.
static void
fx_pair(fixture *fx)
{
    op acc, con;
    op_init(&acc, 5000);
    op_init(&con, 5000);
    tp__listener_accept(fx->l, acc.aio);
    tp__transport_connect(fx->t, tp__listener_addr(fx->l), con.aio);
    op_wait(&con, 10000);
    op_wait(&acc, 10000);
    TP_CHECK_OK(tp_aio_status(con.aio), tp_aio_error(con.aio));
    TP_CHECK_OK(tp_aio_status(acc.aio), tp_aio_error(acc.aio));
    fx->c = tp_aio_get_output(con.aio, 0);
    fx->s = tp_aio_get_output(acc.aio, 0);
    op_fini(&acc);
    op_fini(&con);
}

static void
fx_fini(fixture *fx)
{
    tp__conn_unref(fx->c);
    tp__conn_unref(fx->s);
    tp__listener_destroy(fx->l);
    tp__transport_destroy(fx->t);
    tp__loop_destroy(fx->loop);
}

static void
start(tp_conn *c, bool write, op *o, void *p, size_t n)
{
    tp_iov iov = {p, n};
    TP_CHECK_OK(tp_aio_set_iov(o->aio, 1, &iov), NULL);
    if (write) {
        tp__conn_write(c, o->aio);
    } else {
        tp__conn_read(c, o->aio);
    }
}

// 3 ring sizes and more in odd-sized writes and reads, posted ahead: the
// rings wrap several times and the credits run out and come back.
static void
conn_rings_wrap(void)
{
    fixture fx;
    fx_init(&fx);
    size_t total = (7u << 20) + 12345;
    uint8_t *out = malloc(total), *in = malloc(total);
    TP_CHECK(out != NULL && in != NULL);
    for (size_t i = 0; i < total; i++) {
        out[i] = (uint8_t)(i * 31 + (i >> 11));
    }
    memset(in, 0, total);
    tp_ibv_fake_stats s0, s1;
    tp__ibv_fake_stats(&s0);
    enum { N = 6 };
    size_t wsz[N] = {1, 777777, 3u << 20, 5, 1u << 20, 0};
    size_t sum = 0;
    for (int i = 0; i < N - 1; i++) {
        sum += wsz[i];
    }
    wsz[N - 1] = total - sum;
    op w[N], r[N];
    size_t off = 0;
    for (int i = 0; i < N; i++) {
        op_init(&w[i], 10000);
        start(fx.c, true, &w[i], out + off, wsz[i]);
        off += wsz[i];
    }
    // Reads cut differently from the writes.
    size_t rsz[N] = {4096, 1, 2u << 20, 999, 3u << 20, 0};
    sum = 0;
    for (int i = 0; i < N - 1; i++) {
        sum += rsz[i];
    }
    rsz[N - 1] = total - sum;
    off = 0;
    for (int i = 0; i < N; i++) {
        op_init(&r[i], 10000);
        start(fx.s, false, &r[i], in + off, rsz[i]);
        off += rsz[i];
    }
    for (int i = 0; i < N; i++) {
        op_wait(&w[i], 15000);
        op_wait(&r[i], 15000);
        TP_CHECK_OK(tp_aio_status(w[i].aio), tp_aio_error(w[i].aio));
        TP_CHECK_OK(tp_aio_status(r[i].aio), tp_aio_error(r[i].aio));
        TP_CHECK_EQ(tp_aio_count(r[i].aio), rsz[i]);
        op_fini(&w[i]);
        op_fini(&r[i]);
    }
    TP_CHECK(memcmp(out, in, total) == 0);
    tp__ibv_fake_stats(&s1);
    // At least one RDMA write per 256 KiB segment.
    TP_CHECK(s1.fs_writes - s0.fs_writes >= total / (256u << 10));
    free(out);
    free(in);
    fx_fini(&fx);
}

// The peer closes in the middle of a message: what it wrote before stays
// readable, the read that needs more fails promptly naming the peer.
static void
conn_peer_closes_mid_message(void)
{
    fixture fx;
    fx_init(&fx);
    uint8_t out[100], in[200];
    memset(out, 9, sizeof(out));
    op w;
    op_init(&w, 5000);
    start(fx.c, true, &w, out, sizeof(out));
    op_wait(&w, 10000);
    TP_CHECK_OK(tp_aio_status(w.aio), tp_aio_error(w.aio));
    op_fini(&w);
    tp__conn_close(fx.c);
    usleep(50000);
    // 60 of the 100 bytes: there.
    op r;
    op_init(&r, 5000);
    start(fx.s, false, &r, in, 60);
    op_wait(&r, 10000);
    TP_CHECK_OK(tp_aio_status(r.aio), tp_aio_error(r.aio));
    op_fini(&r);
    // 140 more: only 40 will ever come.
    uint64_t t0 = tp__now_ns();
    op_init(&r, 5000);
    start(fx.s, false, &r, in + 60, 140);
    op_wait(&r, 10000);
    TP_CHECK((tp__now_ns() - t0) / 1000000u < 1000);
    tp_status st = tp_aio_status(r.aio);
    const char *msg = tp_error_message(tp_aio_error(r.aio));
    TP_CHECKF(st == TP_ECONNRESET, "got %s: %s", tp_status_name(st), msg);
    TP_CHECK_STR_CONTAINS(msg, tp__conn_peer(fx.s));
    TP_CHECK_EQ(tp_aio_count(r.aio), 40);
    TP_CHECK(memcmp(in, out, 100) == 0);
    op_fini(&r);
    fx_fini(&fx);
}

// A second pair on the same transport takes the registered rings of the
// first (closed) pair: no new registration, and the data is right.
static void
conn_rings_reused(void)
{
    fixture fx;
    fx_init(&fx);
    tp__conn_unref(fx.c);
    tp__conn_unref(fx.s);
    usleep(50000); // the conns are freed on the loop
    tp_ibv_fake_stats s0, s1;
    tp__ibv_fake_stats(&s0);
    op acc, con;
    op_init(&acc, 5000);
    op_init(&con, 5000);
    tp__listener_accept(fx.l, acc.aio);
    tp__transport_connect(fx.t, tp__listener_addr(fx.l), con.aio);
    op_wait(&con, 10000);
    op_wait(&acc, 10000);
    TP_CHECK_OK(tp_aio_status(con.aio), tp_aio_error(con.aio));
    TP_CHECK_OK(tp_aio_status(acc.aio), tp_aio_error(acc.aio));
    fx.c = tp_aio_get_output(con.aio, 0);
    fx.s = tp_aio_get_output(acc.aio, 0);
    op_fini(&acc);
    op_fini(&con);
    tp__ibv_fake_stats(&s1);
    TP_CHECK_EQ(s1.fs_reg_mr - s0.fs_reg_mr, 0);
    char out[32] = "reused rings carry new data", in[32] = {0};
    op w, r;
    op_init(&w, 5000);
    op_init(&r, 5000);
    start(fx.c, true, &w, out, sizeof(out));
    start(fx.s, false, &r, in, sizeof(in));
    op_wait(&w, 10000);
    op_wait(&r, 10000);
    TP_CHECK_OK(tp_aio_status(r.aio), tp_aio_error(r.aio));
    TP_CHECK(memcmp(out, in, sizeof(in)) == 0);
    op_fini(&w);
    op_fini(&r);
    fx_fini(&fx);
}

// A peer that writes a segment longer than the free ring closes that
// connection with TP_EPROTO naming the peer; the transport goes on.
static void
conn_bad_segment_from_peer(void)
{
    fixture fx;
    fx_init(&fx);
    uint8_t out[16] = "0123456789abcdef", in[16];
    op r;
    op_init(&r, 5000);
    start(fx.s, false, &r, in, sizeof(in));
    tp__ibv_fake_corrupt_next_imm(0x7ffffff0u); // "2 GiB written"
    op w;
    op_init(&w, 5000);
    start(fx.c, true, &w, out, sizeof(out));
    op_wait(&r, 10000);
    tp_status st = tp_aio_status(r.aio);
    const char *msg = tp_error_message(tp_aio_error(r.aio));
    TP_CHECKF(st == TP_EPROTO, "got %s: %s", tp_status_name(st), msg);
    TP_CHECK_STR_CONTAINS(msg, tp__conn_peer(fx.s));
    TP_CHECK_STR_CONTAINS(msg, "protocol error");
    TP_CHECK_STR_CONTAINS(msg, "were free");
    op_wait(&w, 10000);
    op_fini(&w);
    op_fini(&r);
    // The writer learns it through the bootstrap: its next read fails.
    op r2;
    op_init(&r2, 5000);
    start(fx.c, false, &r2, in, 1);
    op_wait(&r2, 10000);
    TP_CHECK(TP_STATUS_IS_CONN(tp_aio_status(r2.aio)));
    op_fini(&r2);
    fx_fini(&fx);
}

// ---- tunables on the fake --------------------------------------------------

// @n bytes from @a to @b, both sides' ops in flight together.
static void
send_check(tp_conn *a, tp_conn *b, size_t n)
{
    uint8_t *out = malloc(n), *in = calloc(1, n);
    TP_CHECK(out != NULL && in != NULL);
    for (size_t i = 0; i < n; i++) {
        out[i] = (uint8_t)(i * 7 + (i >> 13));
    }
    op w, r;
    op_init(&w, 10000);
    op_init(&r, 10000);
    start(a, true, &w, out, n);
    start(b, false, &r, in, n);
    op_wait(&w, 15000);
    op_wait(&r, 15000);
    TP_CHECK_OK(tp_aio_status(w.aio), tp_aio_error(w.aio));
    TP_CHECK_OK(tp_aio_status(r.aio), tp_aio_error(r.aio));
    TP_CHECK(memcmp(out, in, n) == 0);
    op_fini(&w);
    op_fini(&r);
    free(out);
    free(in);
}

static const char *
dev_of(tp_transport *t)
{
    static char buf[TP_IBV_NAME_LEN + 8];
    ibv_ctx *x = tp_transport_ctx(t);
    tp__ibv_fake_dev_name(x->x_dev, buf, sizeof(buf));
    return buf;
}

// The device and port come from TP_IBV_DEVICE ("name" or "name:port") and
// TP_IBV_PORT; by default the first device's first active port.
static void
tunables_device_by_name(void)
{
    fixture fx;
    fx_init(&fx);
    TP_CHECKF(strcmp(dev_of(fx.t), "fake_0:1") == 0, "got %s", dev_of(fx.t));
    fx_fini(&fx);
    const char *const by_name[] = {"ibv_device", "fake_1", NULL};
    fx_init_with(&fx, by_name);
    TP_CHECKF(strcmp(dev_of(fx.t), "fake_1:1") == 0, "got %s", dev_of(fx.t));
    send_check(fx.c, fx.s, 1000);
    fx_fini(&fx);
    const char *const with_port[] = {"TP_IBV_DEVICE", "fake_1:1", NULL};
    fx_init_with(&fx, with_port);
    TP_CHECKF(strcmp(dev_of(fx.t), "fake_1:1") == 0, "got %s", dev_of(fx.t));
    fx_fini(&fx);
}

// Transport creation on @sets fails; the message has each of @want.
static void
create_fails(const char *const *sets, tp_status st, const char *const *want)
{
    tp_config cfg;
    tp_loop *loop = NULL;
    tp_transport *t = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp__config_load(&cfg, &err), err);
    for (size_t i = 0; sets[i] != NULL; i += 2) {
        TP_CHECK_OK(tp__config_set(&cfg, sets[i], sets[i + 1], &err), err);
    }
    TP_CHECK_OK(tp__loop_create(&cfg, "ibvt", &loop, &err), err);
    tp_status got = tp__transport_create("ibv", loop, &cfg, &t, &err);
    const char *msg = tp_error_message(err);
    TP_CHECKF(got == st, "got %s: %s", tp_status_name(got), msg);
    for (size_t i = 0; want[i] != NULL; i++) {
        TP_CHECK_STR_CONTAINS(msg, want[i]);
    }
    tp_error_unref(err);
    tp__loop_destroy(loop);
}

// A device that is not there is refused with the list of those that are;
// a port that is down or missing, and a malformed port, are refused naming
// device, port and variable.
static void
tunables_device_refused(void)
{
    need_fake();
    const char *const unknown[] = {"ibv_device", "mlx5_0", NULL};
    const char *const unknown_msg[] = {"TP_IBV_DEVICE=mlx5_0", "no such device",
                                       "fake_0", "fake_1", NULL};
    create_fails(unknown, TP_ENOTSUP, unknown_msg);
    const char *const down[] = {"ibv_device", "fake_1", "ibv_port", "2", NULL};
    const char *const down_msg[] = {"fake_1 port 2", "not ACTIVE", NULL};
    create_fails(down, TP_ENOTSUP, down_msg);
    const char *const missing[] = {"ibv_device", "fake_0:3", NULL};
    const char *const missing_msg[] = {"fake_0 has ports 1..1", "port 3", NULL};
    create_fails(missing, TP_ENOTSUP, missing_msg);
    const char *const bad[] = {"ibv_device", "fake_0:x", NULL};
    const char *const bad_msg[] = {"TP_IBV_DEVICE=fake_0:x", NULL};
    create_fails(bad, TP_ENOTSUP, bad_msg); // "not viable", with why
    // Values out of bounds are refused by the table, naming the variable.
    tp_config cfg;
    tp_error *err = NULL;
    tp__config_defaults(&cfg);
    TP_CHECK_EQ(tp__config_set(&cfg, "TP_IBV_RING_SIZE", "100K", &err),
                TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "TP_IBV_RING_SIZE");
    tp_error_unref(err);
    err = NULL;
    TP_CHECK_EQ(tp__config_set(&cfg, "TP_IBV_POOL_MAX", "65", &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "TP_IBV_POOL_MAX");
    tp_error_unref(err);
    err = NULL;
    TP_CHECK_EQ(tp__config_set(&cfg, "TP_IBV_GID_INDEX", "-2", &err),
                TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "TP_IBV_GID_INDEX");
    tp_error_unref(err);
    err = NULL;
    TP_CHECK_EQ(tp__config_set(&cfg, "TP_IBV_MTU", "1500", &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "TP_IBV_MTU");
    tp_error_unref(err);
}

// TP_IBV_RING_SIZE sets the rings on the wire: a 64 KiB ring carries 1 MiB
// both ways in writes of at most 64 KiB.
static void
tunables_ring_size_used(void)
{
    fixture fx;
    const char *const sets[] = {"ibv_ring_size", "64K", NULL};
    fx_init_with(&fx, sets);
    ibv_ctx *x = tp_transport_ctx(fx.t);
    TP_CHECK_EQ(x->x_ring_size, 64u << 10);
    TP_CHECK_EQ(ibv_conn_of(fx.c)->ic_buf_len, 128u << 10);
    TP_CHECK_EQ(ibv_conn_of(fx.c)->ic_p.p_tx_cap, 64u << 10);
    tp_ibv_fake_stats s0, s1;
    tp__ibv_fake_stats(&s0);
    size_t n = 1u << 20;
    send_check(fx.c, fx.s, n);
    send_check(fx.s, fx.c, n);
    tp__ibv_fake_stats(&s1);
    TP_CHECK(s1.fs_writes - s0.fs_writes >= 2 * n / (64u << 10));
    fx_fini(&fx);
}

// Two ends with different ring sizes refuse the connection, naming both
// sizes and the variable.
static void
tunables_ring_size_mismatch(void)
{
    fixture fx;
    const char *const sets[] = {"ibv_ring_size", "128K", NULL};
    fx_init_with(&fx, sets);
    tp_config cfg2 = fx.cfg;
    tp_error *err = NULL;
    TP_CHECK_OK(tp__config_set(&cfg2, "ibv_ring_size", "64K", &err), err);
    tp_transport *t2 = NULL;
    TP_CHECK_OK(tp__transport_create("ibv", fx.loop, &cfg2, &t2, &err), err);
    op con;
    op_init(&con, 5000);
    tp__transport_connect(t2, tp__listener_addr(fx.l), con.aio);
    op_wait(&con, 10000);
    tp_status st = tp_aio_status(con.aio);
    const char *msg = tp_error_message(tp_aio_error(con.aio));
    TP_CHECKF(st == TP_EPROTO, "got %s: %s", tp_status_name(st), msg);
    TP_CHECK_STR_CONTAINS(msg, "TP_IBV_RING_SIZE");
    TP_CHECK_STR_CONTAINS(msg, "131072");
    TP_CHECK_STR_CONTAINS(msg, "65536");
    op_fini(&con);
    // The listener goes on: a peer that agrees still connects.
    tp__conn_unref(fx.c);
    tp__conn_unref(fx.s);
    fx_pair(&fx);
    send_check(fx.c, fx.s, 300000);
    tp__transport_destroy(t2);
    fx_fini(&fx);
}

// TP_IBV_POOL_MAX bounds the registered rings kept: with 1, of a closed
// pair's two ring pairs one is kept and one released; with 0 none.
static void
tunables_pool_max(void)
{
    fixture fx;
    const char *const one[] = {"ibv_pool_max", "1", NULL};
    fx_init_with(&fx, one);
    ibv_ctx *x = tp_transport_ctx(fx.t);
    tp_ibv_fake_stats s0, s1;
    tp__ibv_fake_stats(&s0);
    tp__conn_unref(fx.c);
    tp__conn_unref(fx.s);
    usleep(50000); // the conns are freed on the loop
    tp__ibv_fake_stats(&s1);
    TP_CHECK_EQ(x->x_npool, 1);
    TP_CHECK_EQ(s1.fs_dereg_mr - s0.fs_dereg_mr, 1);
    fx_pair(&fx); // one ring pair from the pool, one registered
    tp__ibv_fake_stats(&s0);
    TP_CHECK_EQ(s0.fs_reg_mr - s1.fs_reg_mr, 1);
    TP_CHECK_EQ(x->x_npool, 0);
    fx_fini(&fx);
    const char *const none[] = {"ibv_pool_max", "0", NULL};
    fx_init_with(&fx, none);
    x = tp_transport_ctx(fx.t);
    tp__conn_unref(fx.c);
    tp__conn_unref(fx.s);
    usleep(50000);
    TP_CHECK_EQ(x->x_npool, 0);
    tp__ibv_fake_stats(&s0);
    fx_pair(&fx);
    tp__ibv_fake_stats(&s1);
    TP_CHECK_EQ(s1.fs_reg_mr - s0.fs_reg_mr, 2);
    fx_fini(&fx);
}

// Without the fake, viability asks the real device; here there is none,
// and the reason says what is missing.
static void
real_viability_reason(void)
{
    const tp_ibv_verbs *prev = tp__ibv_verbs();
    tp__ibv_verbs_override(NULL);
    const tp_transport_ops *ops = tp__transport_find("ibv");
    TP_CHECK(ops != NULL);
    tp_config cfg;
    tp_error *err = NULL;
    TP_CHECK_OK(tp__config_load(&cfg, &err), err);
    char why[512] = "";
    bool ok = ops->is_viable(&cfg, why, sizeof(why));
    tp__ibv_verbs_override(prev == &tp__ibv_verbs_real ? NULL : prev);
    if (ok) {
        tp_test_skip("this host has an RDMA device");
    }
    TP_CHECK(strlen(why) > 0);
    TP_CHECK(strstr(why, "device") != NULL);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE(proto_wrap_around),
    TP_TEST_CASE(proto_credits_exhausted_then_returned),
    TP_TEST_CASE(proto_short_write),
    TP_TEST_CASE(proto_malformed),
    TP_TEST_CASE(mr_cache_reuses),
    TP_TEST_CASE(conn_rings_wrap),
    TP_TEST_CASE(conn_rings_reused),
    TP_TEST_CASE(conn_peer_closes_mid_message),
    TP_TEST_CASE(conn_bad_segment_from_peer),
    TP_TEST_CASE(tunables_device_by_name),
    TP_TEST_CASE(tunables_device_refused),
    TP_TEST_CASE(tunables_ring_size_used),
    TP_TEST_CASE(tunables_ring_size_mismatch),
    TP_TEST_CASE(tunables_pool_max),
    TP_TEST_CASE(real_viability_reason),
};

TP_TEST_MAIN(cases)
