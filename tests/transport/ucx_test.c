// SPDX-License-Identifier: Apache-2.0
// ucx_test.c - cases of the ucx transport beyond the conformance suite:
// the opt-in, the domain, address forms, the job-secret exchange over the
// UCP stream, a scattered (multi-iov) write and read, the lanes log, and
// flow control (the window, forged credits), reads posted to UCP and the
// cancel of one (it closes the conn), and no wake-up lost as a loop goes
// to sleep. CTest runs it with TP_UCX=1 and UCX_TLS=tcp.

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#include "core/aio.h"
#include "core/auth.h"
#include "core/config.h"
#include "core/loop.h"
#include <tpipe/log.h>
#include "tp_test.h"
#include "tp_test_op.h"
#include "transport/transport.h"
#include "transport/ucx/ucx_impl.h"

typedef struct fixture {
    tp_config cfg;
    tp_loop *loop;
    tp_transport *t;
    tp_listener *l;
} fixture;

// @spin_us >= 0 sets the loop's TP_LOOP_SPIN_US.
static void
fx_init_spin(fixture *fx, int64_t spin_us)
{
    tp_error *err = NULL;
    memset(fx, 0, sizeof(*fx));
    TP_CHECK_OK(tp__config_load(&fx->cfg, &err), err);
    if (spin_us >= 0) {
        fx->cfg.loop_spin_us = spin_us;
    }
    TP_CHECK_OK(tp__loop_create(&fx->cfg, "ucxt", &fx->loop, &err), err);
    TP_CHECK_OK(tp__transport_create("ucx", fx->loop, &fx->cfg, &fx->t, &err),
                err);
    TP_CHECK_OK(tp__transport_listen(fx->t, "ucx://127.0.0.1:0", &fx->l, &err),
                err);
}

static void
fx_init(fixture *fx)
{
    fx_init_spin(fx, -1);
}

static void
fx_fini(fixture *fx)
{
    if (fx->l != NULL) {
        tp__listener_destroy(fx->l);
    }
    tp__transport_destroy(fx->t);
    tp__loop_destroy(fx->loop);
}

static tp_conn *
do_connect(fixture *fx, const char *addr, tp_status *st_p, char *msg,
           size_t len)
{
    op o;
    op_init(&o, 5000);
    tp__transport_connect(fx->t, addr, o.aio);
    op_wait(&o, 10000);
    *st_p = tp_aio_status(o.aio);
    snprintf(msg, len, "%s",
             tp_aio_error(o.aio) ? tp_error_message(tp_aio_error(o.aio)) : "");
    tp_conn *c = tp_aio_get_output(o.aio, 0);
    op_fini(&o);
    return c;
}

static void
pair(fixture *fx, tp_conn **c_p, tp_conn **s_p)
{
    op acc;
    op_init(&acc, 5000);
    tp__listener_accept(fx->l, acc.aio);
    tp_status st;
    char msg[512];
    *c_p = do_connect(fx, tp__listener_addr(fx->l), &st, msg, sizeof(msg));
    TP_CHECKF(st == TP_OK, "connect: %s", msg);
    op_wait(&acc, 10000);
    TP_CHECK_OK(tp_aio_status(acc.aio), tp_aio_error(acc.aio));
    *s_p = tp_aio_get_output(acc.aio, 0);
    op_fini(&acc);
}

static void
xfer_iov(tp_conn *c, bool write, tp_iov *iov, unsigned n)
{
    op o;
    op_init(&o, 5000);
    TP_CHECK_OK(tp_aio_set_iov(o.aio, n, iov), NULL);
    if (write) {
        tp__conn_write(c, o.aio);
    } else {
        tp__conn_read(c, o.aio);
    }
    op_wait(&o, 10000);
    TP_CHECK_OK(tp_aio_status(o.aio), tp_aio_error(o.aio));
    op_fini(&o);
}

// Without TP_UCX=1 the transport says it is off, and why.
static void
opt_in(void)
{
    const tp_transport_ops *ops = tp__transport_find("ucx");
    TP_CHECK(ops != NULL);
    tp_config cfg;
    tp_error *err = NULL;
    TP_CHECK_OK(tp__config_load(&cfg, &err), err);
    char why[256] = "";
    unsetenv("TP_UCX");
    TP_CHECK(!ops->is_viable(&cfg, why, sizeof(why)));
    TP_CHECK_STR_CONTAINS(why, "TP_UCX=1");
    setenv("TP_UCX", "1", 1);
    TP_CHECKF(ops->is_viable(&cfg, why, sizeof(why)), "not viable: %s", why);
}

// The domain names UCX and its major.minor; listener addresses are
// ucx://HOST:PORT with the real port; connections name their peer.
static void
domain_and_addresses(void)
{
    fixture fx;
    fx_init(&fx);
    unsigned major, minor, release;
    ucp_get_version(&major, &minor, &release);
    char want[32];
    snprintf(want, sizeof(want), "ucx:%u.%u", major, minor);
    TP_CHECKF(strcmp(tp__transport_domain(fx.t), want) == 0, "domain %s",
              tp__transport_domain(fx.t));
    const char *a = tp__listener_addr(fx.l);
    TP_CHECKF(strncmp(a, "ucx://127.0.0.1:", 16) == 0 && atoi(a + 16) > 0,
              "listener address %s", a);
    tp_conn *c, *s;
    pair(&fx, &c, &s);
    TP_CHECKF(strcmp(tp__conn_peer(c), a + 6) == 0, "peer %s",
              tp__conn_peer(c));
    TP_CHECK_STR_CONTAINS(tp__conn_peer(s), "127.0.0.1:");
    // Another scheme and host names are argument errors naming the
    // address.
    tp_status st;
    char msg[512];
    TP_CHECK(do_connect(&fx, "tcp://127.0.0.1:1", &st, msg, sizeof(msg)) ==
             NULL);
    TP_CHECK_EQ(st, TP_EINVAL);
    TP_CHECK_STR_CONTAINS(msg, "tcp://127.0.0.1:1");
    TP_CHECK(do_connect(&fx, "ucx://localhost:1", &st, msg, sizeof(msg)) ==
             NULL);
    TP_CHECK_EQ(st, TP_EINVAL);
    TP_CHECK_STR_CONTAINS(msg, "numeric");
    tp_listener *l2 = NULL;
    tp_error *err = NULL;
    TP_CHECK(tp__transport_listen(fx.t, "shm://x", &l2, &err) == TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "ucx://");
    tp_error_unref(err);
    tp__conn_unref(c);
    tp__conn_unref(s);
    fx_fini(&fx);
}

// With a job secret both ends run the exchange of core/auth.h over the
// stream before the conn is handed out; data follows it intact.
static void
job_secret(void)
{
    setenv("TP_JOB_TOKEN", "0123456789abcdef0123456789abcdef", 1);
    unsetenv("TP_JOB_TOKEN_FILE");
    tp__auth_reload();
    bool on = false;
    if (tp__auth_enabled(&on, NULL) != TP_OK || !on) {
        tp_test_skip("no job secret support in this build (libcrypto)");
    }
    fixture fx;
    fx_init(&fx);
    tp_conn *c, *s;
    pair(&fx, &c, &s);
    char out[64] = "after the job-secret exchange", in[64];
    tp_iov wi = {out, sizeof(out)}, ri = {in, sizeof(in)};
    xfer_iov(c, true, &wi, 1);
    xfer_iov(s, false, &ri, 1);
    TP_CHECK(memcmp(out, in, sizeof(in)) == 0);
    tp__conn_unref(c);
    tp__conn_unref(s);
    fx_fini(&fx);
    unsetenv("TP_JOB_TOKEN");
    tp__auth_reload();
}

// A write of several iovs (UCP's iov datatype) read back with other
// boundaries.
static void
scattered(void)
{
    fixture fx;
    fx_init(&fx);
    tp_conn *c, *s;
    pair(&fx, &c, &s);
    enum { N = 300000 };
    uint8_t *out = malloc(N), *in = malloc(N);
    TP_CHECK(out != NULL && in != NULL);
    for (unsigned i = 0; i < N; i++) {
        out[i] = (uint8_t)(i * 7u + (i >> 8));
    }
    tp_iov w[3] = {{out, 10}, {out + 10, 0}, {out + 10, N - 10}};
    tp_iov r[4] = {{in, 1},
                   {in + 1, 4095},
                   {in + 4096, 100000},
                   {in + 104096, N - 104096}};
    xfer_iov(c, true, w, 3);
    xfer_iov(s, false, r, 4);
    TP_CHECK(memcmp(out, in, N) == 0);
    free(out);
    free(in);
    tp__conn_unref(c);
    tp__conn_unref(s);
    fx_fini(&fx);
}

// At INFO each connection logs the lanes UCP chose (TP-UCX-LANES), on
// both sides, naming the peer: with UCX_TLS=tcp (as CTest runs this) the
// data lane is tcp.
typedef struct lane_log {
    pthread_mutex_t mu;
    int n;
    char msg[2][512];
} lane_log;

static void
lanes_sink(tp_log_level level, const char *id, const char *msg, void *arg)
{
    lane_log *ll = arg;
    (void)level;
    if (strcmp(id, "TP-UCX-LANES") != 0) {
        return;
    }
    pthread_mutex_lock(&ll->mu);
    if (ll->n < 2) {
        snprintf(ll->msg[ll->n], sizeof(ll->msg[0]), "%s", msg);
    }
    ll->n++;
    pthread_mutex_unlock(&ll->mu);
}

static void
lanes_logged(void)
{
    lane_log ll = {.mu = PTHREAD_MUTEX_INITIALIZER};
    tp_log_level old = tp_log_get_level();
    tp_log_set_handler(lanes_sink, &ll);
    tp_log_set_level(TP_LOG_LEVEL_INFO);
    fixture fx;
    fx_init(&fx);
    tp_conn *c, *s;
    pair(&fx, &c, &s);
    tp__conn_unref(c);
    tp__conn_unref(s);
    fx_fini(&fx);
    tp_log_set_level(old);
    tp_log_set_handler(NULL, NULL);
    TP_CHECK_EQ(ll.n, 2);
    const char *tls = getenv("UCX_TLS");
    for (int i = 0; i < 2; i++) {
        TP_CHECK_STR_CONTAINS(ll.msg[i], "peer ");
        TP_CHECK_STR_CONTAINS(ll.msg[i], "lane[0]");
        if (tls != NULL && strcmp(tls, "tcp") == 0) {
            TP_CHECK_STR_CONTAINS(ll.msg[i], "tcp/");
        }
    }
    TP_CHECK(strstr(ll.msg[0], "connection to ") != NULL ||
             strstr(ll.msg[1], "connection to ") != NULL);
    TP_CHECK(strstr(ll.msg[0], "connection from ") != NULL ||
             strstr(ll.msg[1], "connection from ") != NULL);
}

// Flow control: with TP_UCX_WINDOW=256K, writes to a peer that never
// reads complete up to the window and no further (the one that crosses
// it is held in part, those behind it whole); a held write canceled
// leaves the conn usable; reading releases the rest, intact and in order.
static void
window_holds_writes(void)
{
    setenv("TP_UCX_WINDOW", "256K", 1);
    fixture fx;
    fx_init(&fx);
    unsetenv("TP_UCX_WINDOW");
    tp_conn *c, *s;
    pair(&fx, &c, &s);
    // 96K writes: two fit the window, the third crosses it (its first
    // part spans both of its iovs).
    enum { NW = 12, WLEN = 96 * 1024, BIG = 4 << 20 };
    const size_t total = (size_t)NW * WLEN + BIG;
    uint8_t *out = malloc(total), *in = malloc(total), extra[4096];
    TP_CHECK(out != NULL && in != NULL);
    for (size_t i = 0; i < total; i++) {
        out[i] = (uint8_t)(i * 13u + (i >> 10));
    }
    op w[NW + 1], x;
    for (int i = 0; i <= NW; i++) {
        op_init(&w[i], 0);
        uint8_t *p = out + (size_t)i * WLEN;
        tp_iov iov[2] = {{p, 1000}, {p + 1000, (i < NW ? WLEN : BIG) - 1000}};
        TP_CHECK_OK(tp_aio_set_iov(w[i].aio, 2, iov), NULL);
        tp__conn_write(c, w[i].aio);
    }
    op_init(&x, 0);
    tp_iov xi = {extra, sizeof(extra)};
    TP_CHECK_OK(tp_aio_set_iov(x.aio, 1, &xi), NULL);
    tp__conn_write(c, x.aio);
    op_wait(&w[1], 5000);
    usleep(300000);
    int ndone = 0;
    for (int i = 0; i <= NW; i++) {
        ndone += atomic_load(&w[i].done);
    }
    TP_CHECKF(ndone == 2,
              "%d writes of 96K completed with a 256K window and "
              "no reader (want 2)",
              ndone);
    TP_CHECK_OK(tp_aio_status(w[0].aio), tp_aio_error(w[0].aio));
    TP_CHECK_OK(tp_aio_status(w[1].aio), tp_aio_error(w[1].aio));
    // A write held whole cancels cleanly: its bytes never went out.
    tp_aio_cancel(x.aio);
    op_wait(&x, 5000);
    TP_CHECK_EQ(tp_aio_status(x.aio), TP_ECANCELED);
    // Reading releases the rest (read with other boundaries).
    tp_iov r[3] = {{in, 5}, {in + 5, 300000}, {in + 300005, total - 300005}};
    xfer_iov(s, false, r, 3);
    for (int i = 0; i <= NW; i++) {
        op_wait(&w[i], 5000);
        TP_CHECKF(tp_aio_status(w[i].aio) == TP_OK, "write %d: %s", i,
                  tp_error_message(tp_aio_error(w[i].aio)));
        op_fini(&w[i]);
    }
    op_fini(&x);
    TP_CHECK(memcmp(out, in, total) == 0);
    // Still usable both ways.
    char hi[8] = "after", back[8];
    tp_iov hw = {hi, sizeof(hi)}, hr = {back, sizeof(back)};
    xfer_iov(s, true, &hw, 1);
    xfer_iov(c, false, &hr, 1);
    TP_CHECK(memcmp(hi, back, sizeof(hi)) == 0);
    free(out);
    free(in);
    tp__conn_unref(c);
    tp__conn_unref(s);
    fx_fini(&fx);
}

typedef struct forge {
    tp_conn *f_conn;
    uint64_t f_consumed;
    size_t f_len; // 8: a credit; else a message of that many bytes
} forge;

// Loop thread: sends a credit from f_conn to its peer.
static void
forge_task(void *arg)
{
    forge *f = arg;
    ucx_conn *c = ucx_conn_of(f->f_conn);
    if (f->f_len == UCX_CREDIT_LEN) {
        TP_CHECK_EQ(tp__ucx_credit_send(c, f->f_consumed), UCS_OK);
    } else {
        uint8_t b[4] = {1, 2, 3, 4};
        TP_CHECK_EQ(tp__ucx_send_bytes(c, b, f->f_len, UCX_AM_CREDIT), UCS_OK);
    }
}

// A credit past the bytes sent, or of the wrong length, closes the conn
// that gets it with TP_EPROTO naming its peer; pending and later ops fail.
static void
forged_credit(void)
{
    for (int k = 0; k < 2; k++) {
        fixture fx;
        fx_init(&fx);
        tp_conn *c, *s;
        pair(&fx, &c, &s);
        char msg[8] = "1234567", got[8];
        tp_iov wi = {msg, sizeof(msg)}, ri = {got, sizeof(got)};
        xfer_iov(c, true, &wi, 1);
        xfer_iov(s, false, &ri, 1);
        op rd;
        op_init(&rd, 0);
        tp_iov bi = {got, sizeof(got)};
        TP_CHECK_OK(tp_aio_set_iov(rd.aio, 1, &bi), NULL);
        tp__conn_read(c, rd.aio);
        // c sent 8 bytes: s claims 1 MiB consumed, or sends 4 bytes.
        forge f = {s, 1u << 20, k == 0 ? UCX_CREDIT_LEN : 4};
        tp__loop_call(fx.loop, forge_task, &f);
        op_wait(&rd, 5000);
        const char *m = tp_error_message(tp_aio_error(rd.aio));
        TP_CHECKF(tp_aio_status(rd.aio) == TP_EPROTO, "read: %s", m);
        TP_CHECK_STR_CONTAINS(m, "protocol error");
        TP_CHECK_STR_CONTAINS(m, tp__conn_peer(c));
        TP_CHECK_STR_CONTAINS(m, k == 0 ? "1048576 bytes consumed, but 8"
                                        : "credit of 4 bytes");
        op_fini(&rd);
        op w;
        op_init(&w, 0);
        TP_CHECK_OK(tp_aio_set_iov(w.aio, 1, &wi), NULL);
        tp__conn_write(c, w.aio);
        op_wait(&w, 5000);
        TP_CHECK_EQ(tp_aio_status(w.aio), TP_EPROTO);
        op_fini(&w);
        tp__conn_unref(c);
        tp__conn_unref(s);
        fx_fini(&fx);
    }
}

// Loop thread: whether a read is posted to UCP (recv.c).
typedef struct posted_q {
    tp_aio *pq_aio;
    bool pq_posted;
} posted_q;

static void
posted_task(void *arg)
{
    posted_q *q = arg;
    q->pq_posted = tp__ucx_read_posted(q->pq_aio);
}

static bool
read_posted(fixture *fx, op *o)
{
    posted_q q = {o->aio, false};
    tp__loop_call(fx->loop, posted_task, &q);
    return q.pq_posted;
}

typedef struct moved_q {
    tp_aio *mq_aio;
    uint64_t mq_moved;
} moved_q;

static void
moved_task(void *arg)
{
    moved_q *q = arg;
    q->mq_moved = q->mq_aio->a_prov_u64[0];
}

// Waits up to 5 s (scaled) until the pending read @o has taken @n bytes.
static void
wait_moved(fixture *fx, op *o, uint64_t n)
{
    uint64_t deadline = tp__now_ns() + (uint64_t)tp_test_ms(5000) * 1000000u;
    moved_q q = {o->aio, 0};
    for (;;) {
        tp__loop_call(fx->loop, moved_task, &q);
        if (q.mq_moved >= n || tp__now_ns() > deadline) {
            break;
        }
        usleep(1000);
    }
    TP_CHECKF(q.mq_moved >= n, "the read took %llu bytes, want %llu",
              (unsigned long long)q.mq_moved, (unsigned long long)n);
}

static void
read_start(tp_conn *c, op *o, int64_t timeout_ms, tp_iov *iov, unsigned n)
{
    op_init(o, timeout_ms);
    TP_CHECK_OK(tp_aio_set_iov(o->aio, n, iov), NULL);
    tp__conn_read(c, o->aio);
}

static void
write_now(tp_conn *c, uint8_t *p, size_t n)
{
    tp_iov iov = {p, n};
    xfer_iov(c, true, &iov, 1);
}

// Reads with no deadline that need 64K or more than UCP holds are posted
// to UCP, which receives into the caller's iovs: larger than the window
// (so in several receives, each earning the writer a credit), scattered
// over iovs with an empty one, queued behind a small read, the bytes
// arrive intact and in order, and the conn stays usable. A read with a
// deadline is not posted, nor any with TP_UCX_RECV_POST=0 (then the same
// bytes arrive the other way).
static void
posted_reads(void)
{
    for (int k = 0; k < 2; k++) {
        setenv("TP_UCX_WINDOW", "256K", 1);
        setenv("TP_UCX_RECV_POST", k == 0 ? "64K" : "0", 1);
        fixture fx;
        fx_init(&fx);
        unsetenv("TP_UCX_WINDOW");
        unsetenv("TP_UCX_RECV_POST");
        tp_conn *c, *s;
        pair(&fx, &c, &s);
        enum { SMALL = 100, A = 3 << 20, B = 700000, D = 128 * 1024 };
        const size_t total = (size_t)SMALL + A + B + D;
        uint8_t *out = malloc(total), *in = malloc(total);
        TP_CHECK(out != NULL && in != NULL);
        for (size_t i = 0; i < total; i++) {
            out[i] = (uint8_t)(i * 29u + (i >> 11));
        }
        memset(in, 0, total);
        uint8_t *a = in + SMALL, *b = a + A, *d = b + B;
        tp_iov i0 = {in, SMALL};
        tp_iov i1[4] = {
            {a, 1}, {a + 1, 0}, {a + 1, 200000}, {a + 200001, A - 200001}};
        tp_iov i2 = {b, B}, i3 = {d, D};
        op r0, r1, r2, r3;
        read_start(s, &r0, 0, &i0, 1);
        read_start(s, &r1, 0, i1, 4);
        read_start(s, &r2, 0, &i2, 1);
        read_start(s, &r3, 10000, &i3, 1);
        TP_CHECK(!read_posted(&fx, &r0)); // under 64K
        write_now(c, out, SMALL);
        op_wait(&r0, 5000);
        TP_CHECK_OK(tp_aio_status(r0.aio), tp_aio_error(r0.aio));
        // r1 waits at the head with nothing held: posted (unless off).
        TP_CHECKF(read_posted(&fx, &r1) == (k == 0), "k=%d: posted %d", k,
                  (int)read_posted(&fx, &r1));
        // In pieces of other boundaries; the window holds the writer
        // until the reader's receives complete and credit it.
        size_t off = SMALL;
        const size_t piece[3] = {50, 1 << 20, (size_t)A + B - 50 - (1 << 20)};
        op w[3];
        for (int i = 0; i < 3; i++) {
            op_init(&w[i], 0);
            tp_iov wi = {out + off, piece[i]};
            TP_CHECK_OK(tp_aio_set_iov(w[i].aio, 1, &wi), NULL);
            tp__conn_write(c, w[i].aio);
            off += piece[i];
        }
        op_wait(&r1, 10000);
        TP_CHECK_OK(tp_aio_status(r1.aio), tp_aio_error(r1.aio));
        TP_CHECK_EQ(tp_aio_count(r1.aio), (uint64_t)A);
        op_wait(&r2, 10000);
        TP_CHECK_OK(tp_aio_status(r2.aio), tp_aio_error(r2.aio));
        TP_CHECK_EQ(tp_aio_count(r2.aio), (uint64_t)B);
        for (int i = 0; i < 3; i++) {
            op_wait(&w[i], 5000);
            TP_CHECK_OK(tp_aio_status(w[i].aio), tp_aio_error(w[i].aio));
            op_fini(&w[i]);
        }
        // r3 has a deadline: taken as before, never posted.
        TP_CHECK(!read_posted(&fx, &r3));
        write_now(c, out + off, D);
        op_wait(&r3, 5000);
        TP_CHECK_OK(tp_aio_status(r3.aio), tp_aio_error(r3.aio));
        TP_CHECK(memcmp(out, in, total) == 0);
        op_fini(&r0);
        op_fini(&r1);
        op_fini(&r2);
        op_fini(&r3);
        // Still usable both ways.
        char hi[8] = "after", back[8];
        tp_iov hw = {hi, sizeof(hi)}, hr = {back, sizeof(back)};
        xfer_iov(s, true, &hw, 1);
        xfer_iov(c, false, &hr, 1);
        TP_CHECK(memcmp(hi, back, sizeof(hi)) == 0);
        free(out);
        free(in);
        tp__conn_unref(c);
        tp__conn_unref(s);
        fx_fini(&fx);
    }
}

// UCX 1.13 cannot take back a posted stream receive, so canceling a
// posted read closes the connection (docs/transport-ucx.md): the read
// completes with TP_ECANCELED, saying so and naming the peer, only once
// UCP has let go of its buffer (freed at once here: ASan would see a late
// write into it), with the bytes UCP put there counted; the read queued
// behind it and later ops fail with TP_ECLOSED, and the peer sees the
// end. A local close with a posted read pending fails it with TP_ECLOSED.
static void
cancel_posted_read(void)
{
    fixture fx;
    fx_init(&fx);
    tp_conn *c, *s;
    pair(&fx, &c, &s);
    // 6 MiB sent (under the 8M window) into a posted 16 MiB read: three
    // of its 2 MiB receives complete, the fourth is still filling.
    const size_t n = 16u << 20, sent = 6u << 20;
    uint8_t *buf = malloc(n), *out = malloc(sent), small[16];
    TP_CHECK(buf != NULL && out != NULL);
    memset(out, 5, sent);
    tp_iov ri = {buf, n}, si = {small, sizeof(small)};
    op r, r2;
    read_start(s, &r, 0, &ri, 1);
    read_start(s, &r2, 0, &si, 1);
    TP_CHECK(read_posted(&fx, &r));
    write_now(c, out, sent);
    wait_moved(&fx, &r, 3u << 20); // three receives completed
    TP_CHECK_EQ(atomic_load(&r.done), 0);
    tp_aio_cancel(r.aio);
    op_wait(&r, 5000);
    const char *m = tp_error_message(tp_aio_error(r.aio));
    TP_CHECKF(tp_aio_status(r.aio) == TP_ECANCELED, "read: %s", m);
    TP_CHECK_STR_CONTAINS(m, "could not be kept");
    TP_CHECK_STR_CONTAINS(m, tp__conn_peer(s));
    TP_CHECKF(tp_aio_count(r.aio) >= (3u << 20) && tp_aio_count(r.aio) <= sent,
              "canceled read counts %llu bytes (6 MiB sent)",
              (unsigned long long)tp_aio_count(r.aio));
    for (size_t i = 0; i < tp_aio_count(r.aio); i++) {
        TP_CHECKF(buf[i] == 5, "byte %zu: %u", i, buf[i]);
    }
    free(buf);
    op_wait(&r2, 5000);
    TP_CHECKF(tp_aio_status(r2.aio) == TP_ECLOSED, "read behind: %s",
              tp_error_message(tp_aio_error(r2.aio)));
    op_fini(&r);
    op_fini(&r2);
    op o;
    read_start(s, &o, 5000, &si, 1);
    op_wait(&o, 10000);
    TP_CHECK_EQ(tp_aio_status(o.aio), TP_ECLOSED);
    op_fini(&o);
    // The peer sees the end.
    read_start(c, &o, 5000, &si, 1);
    op_wait(&o, 10000);
    TP_CHECKF(TP_STATUS_IS_CONN(tp_aio_status(o.aio)), "peer read: %s",
              tp_error_message(tp_aio_error(o.aio)));
    op_fini(&o);
    tp__conn_unref(c);
    tp__conn_unref(s);
    // A local close fails a posted read with TP_ECLOSED.
    pair(&fx, &c, &s);
    buf = malloc(1u << 20);
    TP_CHECK(buf != NULL);
    ri.iov_base = buf;
    ri.iov_len = 1u << 20;
    read_start(s, &r, 0, &ri, 1);
    TP_CHECK(read_posted(&fx, &r));
    write_now(c, out, 100000);
    tp__conn_close(s);
    op_wait(&r, 5000);
    TP_CHECKF(tp_aio_status(r.aio) == TP_ECLOSED, "read: %s",
              tp_error_message(tp_aio_error(r.aio)));
    free(buf);
    op_fini(&r);
    free(out);
    tp__conn_unref(c);
    tp__conn_unref(s);
    fx_fini(&fx);
}

// A message that arrives while the reader's loop goes to sleep still
// wakes it (UCP's protocol: progress until it finds nothing, arm the
// worker, and UCS_ERR_BUSY from the arm means do not sleep). Neither loop
// spins (TP_LOOP_SPIN_US=0): each arms its worker and sleeps after every
// poll that finds nothing, and the writer sends after a pause that varies
// from none to 150 us, so messages land before, during and after the
// reader's arm, 1500 times each way, some into reads posted to UCP, some
// into two reads at once. The reads have no deadline and no timer runs: a
// wake-up lost leaves one waiting, and the case fails after 5 s.
static void
idle_wakeup(void)
{
    fixture a, b;
    fx_init_spin(&a, 0);
    fx_init_spin(&b, 0);
    op acc;
    op_init(&acc, 5000);
    tp__listener_accept(a.l, acc.aio);
    tp_status st;
    char msg[512];
    tp_conn *cb = do_connect(&b, tp__listener_addr(a.l), &st, msg, sizeof(msg));
    TP_CHECKF(st == TP_OK, "connect: %s", msg);
    op_wait(&acc, 10000);
    TP_CHECK_OK(tp_aio_status(acc.aio), tp_aio_error(acc.aio));
    tp_conn *ca = tp_aio_get_output(acc.aio, 0);
    op_fini(&acc);
    // Each message is a small one, a large one (a read posted to UCP), or
    // both, read by two reads queued at once: the first completes while
    // the rest of the second is still on its way, and the loop must not
    // sleep on it.
    const size_t big = 128u * 1024;
    uint8_t *out = malloc(64 + big), *in = malloc(64 + big);
    TP_CHECK(out != NULL && in != NULL);
    uint32_t rnd = 12345;
    for (unsigned i = 0; i < 3000; i++) {
        tp_conn *w = (i & 1) ? ca : cb, *r = (i & 1) ? cb : ca;
        size_t len[2] = {64, 0};
        if (i % 8 == 3) {
            len[1] = big;
        } else if (i % 32 == 5) {
            len[0] = big;
        }
        unsigned nmsg = len[1] > 0 ? 2 : 1;
        size_t total = len[0] + len[1];
        for (size_t k = 0; k < total; k++) {
            out[k] = (uint8_t)(i + k * 7);
        }
        memset(in, 0, total);
        tp_iov ri[2] = {{in, len[0]}, {in + len[0], len[1]}};
        tp_iov wi[2] = {{out, len[0]}, {out + len[0], len[1]}};
        op rd[2], wr[2];
        for (unsigned m = 0; m < nmsg; m++) {
            read_start(r, &rd[m], 0, &ri[m], 1);
        }
        rnd = rnd * 1103515245u + 12345u;
        uint64_t pause_ns = (uint64_t)((rnd >> 8) % 150) * 1000u;
        uint64_t until = tp__now_ns() + pause_ns;
        while (tp__now_ns() < until) {
        }
        for (unsigned m = 0; m < nmsg; m++) {
            op_init(&wr[m], 5000);
            TP_CHECK_OK(tp_aio_set_iov(wr[m].aio, 1, &wi[m]), NULL);
            tp__conn_write(w, wr[m].aio);
        }
        for (unsigned m = 0; m < nmsg; m++) {
            TP_CHECKF(op_wait_for(&rd[m], 5000),
                      "message %u, read %u of %u (%zu B, after %llu us): "
                      "not complete in 5 s (a lost wake-up)",
                      i, m + 1, nmsg, len[m],
                      (unsigned long long)(pause_ns / 1000));
            op_wait(&wr[m], 5000);
            TP_CHECK_OK(tp_aio_status(rd[m].aio), tp_aio_error(rd[m].aio));
            TP_CHECK_OK(tp_aio_status(wr[m].aio), tp_aio_error(wr[m].aio));
            TP_CHECK_EQ(tp_aio_count(rd[m].aio), len[m]);
            op_fini(&rd[m]);
            op_fini(&wr[m]);
        }
        TP_CHECK(memcmp(in, out, total) == 0);
    }
    free(out);
    free(in);
    tp__conn_unref(ca);
    tp__conn_unref(cb);
    fx_fini(&b);
    fx_fini(&a);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE(opt_in),
    TP_TEST_CASE(domain_and_addresses),
    TP_TEST_CASE(job_secret),
    TP_TEST_CASE(scattered),
    TP_TEST_CASE(lanes_logged),
    TP_TEST_CASE(window_holds_writes),
    TP_TEST_CASE(forged_credit),
    TP_TEST_CASE(posted_reads),
    TP_TEST_CASE(cancel_posted_read),
    TP_TEST_CASE(idle_wakeup),
};

TP_TEST_MAIN(cases)
