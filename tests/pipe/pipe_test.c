// SPDX-License-Identifier: Apache-2.0
// pipe_test.c - the pipe through its public API, for one (transport,
// channel) combination chosen by the environment: TP_PIPE_TRANSPORT and
// TP_PIPE_CHANNEL. Without both, for every pair of the registries
// (tp__transport_registry x tp__channel_registry, at run time; only those
// with the one that is set), each in a child with both set; a pair that
// cannot run here (a backend not viable or opt-in, lanes over a transport
// that does not reach other hosts) is reported skipped with its reason.
// Both contexts restrict themselves to that pair; cases check the negotiated
// choice, messages of every shape, ordering, close and failure, and, across
// processes (fork), a peer killed mid-message and a peer sending garbage.

#include "tp_test.h"

#include <sys/socket.h>
#include <unistd.h>

#include <tpipe/pipe.h>

#include "channel/channel.h"
#include "core/alloc.h"
#include "core/config.h"
#include "tp_test_op.h"
#include "tp_test_pipe.h"
#include "tp_test_variants.h"
#include "transport/transport.h"

#define WAIT_MS 20000

static const char *
env_or(const char *name, const char *def)
{
    const char *v = getenv(name);
    return (v != NULL && *v != '\0') ? v : def;
}

static const char *
tr_name(void)
{
    return env_or("TP_PIPE_TRANSPORT", "tcp");
}

static const char *
ch_name(void)
{
    return env_or("TP_PIPE_CHANNEL", "basic");
}

static bool
in_process_only(void)
{
    return strcmp(ch_name(), "xth") == 0;
}

// A context allowed exactly the pair under test. Skips if the channel or
// transport cannot work here, with the context's reason.
static tp_context *
make_ctx(const char *name)
{
    tp_context_options o;
    tp_context_options_init(&o);
    o.name = name;
    o.transports = tr_name();
    o.channels = ch_name();
    tp_context *ctx = NULL;
    tp_error *err = NULL;
    tp_status st = tp_context_create(&o, &ctx, &err);
    if (st != TP_OK) {
        tp_test_skip("transport %s not usable here: %s", tr_name(),
                     tp_error_message(err));
    }
    char *rep = tp_context_report(ctx);
    char line[64];
    snprintf(line, sizeof(line), "channel %s: usable", ch_name());
    if (strstr(rep, line) == NULL) {
        char copy[2048];
        snprintf(copy, sizeof(copy), "%s", rep);
        free(rep);
        tp_context_destroy(ctx);
        tp_test_skip("channel %s not usable here:\n%s", ch_name(), copy);
    }
    free(rep);
    return ctx;
}

static const char *
listen_url(void)
{
    return strcmp(tr_name(), "tcp") == 0 ? "tcp://127.0.0.1:0" : NULL;
}

static tp_pipe_listener *
make_listener(tp_context *ctx)
{
    tp_pipe_listener *l = NULL;
    tp_error *err = NULL;
    const char *url = listen_url();
    TP_CHECK_OK(
        tp_context_listen(ctx, url ? &url : NULL, url ? 1 : 0, &l, &err), err);
    return l;
}

// A pipe between two contexts of this process, each allowed the pair.
static void
pair_open(tp_test_pair *pr)
{
    tp_context *a = make_ctx("alice");
    tp_context *b = make_ctx("bob");
    tp_test_pair_open(pr, a, b, listen_url(), WAIT_MS);
}

// A pattern that differs per byte offset and per seed, 8 bytes per step
// (xorshift64), so 256 MiB tensors fill and check quickly.
static uint64_t
pattern_word(uint64_t i, uint32_t seed)
{
    uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull ^ ((uint64_t)seed << 32);
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    return x;
}

static void
fill(uint8_t *p, uint64_t n, uint32_t seed)
{
    if (n == 0) {
        return; // p may be NULL
    }
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w = pattern_word(i / 8, seed);
        memcpy(p + i, &w, 8);
    }
    uint64_t w = pattern_word(i / 8, seed);
    memcpy(p + i, &w, n - i);
}

static bool
check_fill(const uint8_t *p, uint64_t n, uint32_t seed)
{
    if (n == 0) {
        return true;
    }
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w = pattern_word(i / 8, seed);
        if (memcmp(p + i, &w, 8) != 0) {
            return false;
        }
    }
    uint64_t w = pattern_word(i / 8, seed);
    return memcmp(p + i, &w, n - i) == 0;
}

// A message with @np payloads and @nt tensors of the given sizes, filled.
static tp_message *
make_msg(uint32_t np, const uint64_t *psz, uint32_t nt, const uint64_t *tsz,
         uint32_t seed)
{
    tp_message *m = NULL;
    TP_CHECK_OK(tp_message_create(np, nt, &m), NULL);
    char *meta = malloc(64);
    snprintf(meta, 64, "meta-%u", seed);
    m->metadata = meta;
    m->metadata_len = strlen(meta);
    for (uint32_t i = 0; i < np; i++) {
        m->payloads[i].len = psz[i];
        m->payloads[i].data = psz[i] ? malloc(psz[i]) : NULL;
        fill(m->payloads[i].data, psz[i], seed * 100 + i);
    }
    for (uint32_t i = 0; i < nt; i++) {
        m->tensors[i].len = tsz[i];
        m->tensors[i].data = tsz[i] ? malloc(tsz[i]) : NULL;
        fill(m->tensors[i].data, tsz[i], seed * 100 + 50 + i);
    }
    return m;
}

static void
free_sent(tp_message *m)
{
    for (uint32_t i = 0; i < m->npayloads; i++) {
        free(m->payloads[i].data);
    }
    for (uint32_t i = 0; i < m->ntensors; i++) {
        free(m->tensors[i].data);
    }
    free(m->metadata);
    m->metadata = NULL;
    tp_message_destroy(m);
}

// Reads one message from @p and checks it against what make_msg built.
static void
recv_check(tp_pipe *p, uint32_t np, const uint64_t *psz, uint32_t nt,
           const uint64_t *tsz, uint32_t seed)
{
    op rd;
    op_init(&rd, WAIT_MS);
    tp_pipe_read_descriptor(p, rd.aio);
    op_wait(&rd, WAIT_MS);
    TP_CHECK_OK(tp_aio_status(rd.aio), tp_aio_error(rd.aio));
    tp_message *m = tp_aio_get_output(rd.aio, 0);
    TP_CHECK(m != NULL);
    char meta[64];
    snprintf(meta, sizeof(meta), "meta-%u", seed);
    TP_CHECK_EQ(m->metadata_len, strlen(meta));
    TP_CHECK(memcmp(m->metadata, meta, strlen(meta)) == 0);
    TP_CHECK_EQ(m->npayloads, np);
    TP_CHECK_EQ(m->ntensors, nt);
    for (uint32_t i = 0; i < np; i++) {
        TP_CHECK_EQ(m->payloads[i].len, psz[i]);
    }
    for (uint32_t i = 0; i < nt; i++) {
        TP_CHECK_EQ(m->tensors[i].len, tsz[i]);
    }
    // Half the buffers are ours, the other half the pipe allocates.
    void *mine[8] = {0};
    for (uint32_t i = 0; i < nt && i < 8; i++) {
        if (i % 2 == 0 && tsz[i] > 0) {
            mine[i] = malloc(tsz[i]);
            m->tensors[i].data = mine[i];
        }
    }
    atomic_store(&rd.done, 0);
    tp_pipe_read(p, m, rd.aio);
    op_wait(&rd, WAIT_MS);
    TP_CHECK_OK(tp_aio_status(rd.aio), tp_aio_error(rd.aio));
    for (uint32_t i = 0; i < np; i++) {
        TP_CHECKF(check_fill(m->payloads[i].data, psz[i], seed * 100 + i),
                  "payload %u of message %u differs", i, seed);
    }
    for (uint32_t i = 0; i < nt; i++) {
        TP_CHECKF(check_fill(m->tensors[i].data, tsz[i], seed * 100 + 50 + i),
                  "tensor %u (%llu bytes) of message %u differs", i,
                  (unsigned long long)tsz[i], seed);
        if (i < 8 && mine[i] != NULL) {
            TP_CHECK(!m->tensors[i].pipe_owned);
        }
    }
    tp_message_destroy(m);
    for (int i = 0; i < 8; i++) {
        free(mine[i]);
    }
    op_fini(&rd);
}

// Writes @m on @tx and reads it on @rx. The write may complete only once
// the reader has the bytes (xth, cma read from the sender's buffer), so
// it is waited for after the read.
static void
send_recv(tp_pipe *tx, tp_pipe *rx, tp_message *m, uint32_t np,
          const uint64_t *psz, uint32_t nt, const uint64_t *tsz, uint32_t seed)
{
    op w;
    op_init(&w, WAIT_MS);
    tp_pipe_write(tx, m, w.aio);
    recv_check(rx, np, psz, nt, tsz, seed);
    op_wait(&w, WAIT_MS);
    TP_CHECK_OK(tp_aio_status(w.aio), tp_aio_error(w.aio));
    op_fini(&w);
}

// ---- cases ------------------------------------------------------------------

static void
test_negotiates_pair(void)
{
    tp_test_pair pr;
    pair_open(&pr);
    TP_CHECK(strcmp(tp_pipe_transport(pr.pb), tr_name()) == 0);
    TP_CHECK(strcmp(tp_pipe_channel(pr.pb), ch_name()) == 0);
    TP_CHECK(strcmp(tp_pipe_transport(pr.pa), tr_name()) == 0);
    TP_CHECK(strcmp(tp_pipe_channel(pr.pa), ch_name()) == 0);
    char *ra = tp_pipe_report(pr.pa);
    char *rb = tp_pipe_report(pr.pb);
    TP_CHECK(ra != NULL && rb != NULL);
    TP_CHECK_STR_CONTAINS(ra, "pipe from bob");
    TP_CHECK_STR_CONTAINS(rb, "pipe to alice");
    TP_CHECK_STR_CONTAINS(rb, "not allowed by the options");
    free(ra);
    free(rb);
    TP_CHECK_STR_CONTAINS(tp_pipe_peer(pr.pa), "bob");
    tp_test_pair_close(&pr);
}

// Messages of many shapes both ways, while the pipe alternates directions.
static void
test_shapes(void)
{
    tp_test_pair pr;
    pair_open(&pr);
    static const struct {
        uint32_t np;
        uint64_t psz[3];
        uint32_t nt;
        uint64_t tsz[4];
    } shapes[] = {
        {0, {0}, 0, {0}},
        {1, {5}, 0, {0}},
        {0, {0}, 1, {0}},
        {0, {0}, 1, {1}},
        {2, {0, 100}, 3, {64, 0, 4097}},
        {3, {70000, 3, 1}, 2, {1 << 20, 3}},
        {1, {1}, 4, {300000, 262144, 262143, 7}},
        {0, {0}, 1, {(16u << 20) + 5}},
    };
    for (uint32_t k = 0; k < sizeof(shapes) / sizeof(shapes[0]); k++) {
        for (int dir = 0; dir < 2; dir++) {
            tp_pipe *tx = dir ? pr.pa : pr.pb;
            tp_pipe *rx = dir ? pr.pb : pr.pa;
            tp_message *m = make_msg(shapes[k].np, shapes[k].psz, shapes[k].nt,
                                     shapes[k].tsz, k + 1);
            send_recv(tx, rx, m, shapes[k].np, shapes[k].psz, shapes[k].nt,
                      shapes[k].tsz, k + 1);
            free_sent(m);
        }
    }
    tp_test_pair_close(&pr);
}

// Many payloads and tensors in one message: more buffers than one
// connection operation carries (8 iovs), a mix of sizes on the channel
// and inline.
static void
test_many_parts(void)
{
    tp_test_pair pr;
    pair_open(&pr);
    enum { NP = 40, NT = 30 };
    uint64_t psz[NP], tsz[NT];
    for (int i = 0; i < NP; i++) {
        psz[i] = (i % 5 == 0) ? 0 : (uint64_t)(i * 997 % 70000);
    }
    for (int i = 0; i < NT; i++) {
        tsz[i] = (i % 4 == 0)   ? 0
                 : (i % 7 == 0) ? (uint64_t)(300000 + i)
                                : (uint64_t)(i * 31);
    }
    for (int k = 0; k < 3; k++) {
        tp_message *m = make_msg(NP, psz, NT, tsz, (uint32_t)k + 70);
        send_recv(pr.pb, pr.pa, m, NP, psz, NT, tsz, (uint32_t)k + 70);
        free_sent(m);
    }
    tp_test_pair_close(&pr);
}

// The largest size of the suite within one process (xth's only way),
// with a payload beside it.
static void
test_256mib_in_process(void)
{
    tp_test_pair pr;
    pair_open(&pr);
    uint64_t psz[1] = {1000};
    uint64_t tsz[2] = {256u << 20, 5};
    tp_message *m = make_msg(1, psz, 2, tsz, 80);
    send_recv(pr.pb, pr.pa, m, 1, psz, 2, tsz, 80);
    free_sent(m);
    tp_test_pair_close(&pr);
}

// Many writes in flight at once complete in order and arrive in order.
static void
test_ordering(void)
{
    tp_test_pair pr;
    pair_open(&pr);
    enum { N = 200 };
    static op w[N];
    static tp_message *m[N];
    static uint64_t tsz[N];
    uint64_t psz[1] = {16};
    for (int i = 0; i < N; i++) {
        tsz[i] = (i % 7 == 0) ? (uint64_t)(300000 + i) : (uint64_t)(i * 13);
        m[i] = make_msg(1, psz, 1, &tsz[i], (uint32_t)i + 1);
        op_init(&w[i], WAIT_MS);
        tp_pipe_write(pr.pb, m[i], w[i].aio);
    }
    for (int i = 0; i < N; i++) {
        recv_check(pr.pa, 1, psz, 1, &tsz[i], (uint32_t)i + 1);
    }
    for (int i = 0; i < N; i++) {
        op_wait(&w[i], WAIT_MS);
        TP_CHECK_OK(tp_aio_status(w[i].aio), tp_aio_error(w[i].aio));
        op_fini(&w[i]);
        free_sent(m[i]);
    }
    tp_test_pair_close(&pr);
}

// Closing a pipe fails its pending reads and writes, each once, and the
// other end sees the pipe fail; another pipe of the same contexts works.
static void
test_close_pending(void)
{
    tp_test_pair pr;
    pair_open(&pr);
    // A second pipe between the same contexts.
    tp_pipe *pc = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(
        tp_context_connect(pr.b, tp_pipe_listener_addr(pr.l, NULL), &pc, &err),
        err);
    tp_pipe *pd = op_pipe_accept(pr.l, WAIT_MS);

    op rd[3];
    for (int i = 0; i < 3; i++) {
        op_init(&rd[i], WAIT_MS);
        tp_pipe_read_descriptor(pr.pb, rd[i].aio);
    }
    op peer_rd;
    op_init(&peer_rd, WAIT_MS);
    tp_pipe_read_descriptor(pr.pa, peer_rd.aio);
    tp_pipe_close(pr.pb);
    for (int i = 0; i < 3; i++) {
        op_wait(&rd[i], WAIT_MS);
        TP_CHECK_EQ(tp_aio_status(rd[i].aio), TP_ECLOSED);
        op_fini(&rd[i]);
    }
    op_wait(&peer_rd, WAIT_MS);
    TP_CHECK(tp_aio_status(peer_rd.aio) != TP_OK);
    TP_CHECK_STR_CONTAINS(tp_error_message(tp_aio_error(peer_rd.aio)), "bob");
    op_fini(&peer_rd);
    // A write after close fails at once with the same error.
    uint64_t one = 10;
    tp_message *m = make_msg(0, NULL, 1, &one, 9);
    op w;
    op_init(&w, WAIT_MS);
    tp_pipe_write(pr.pb, m, w.aio);
    op_wait(&w, WAIT_MS);
    TP_CHECK_EQ(tp_aio_status(w.aio), TP_ECLOSED);
    op_fini(&w);
    // The other pipe still works.
    send_recv(pc, pd, m, 0, NULL, 1, &one, 9);
    free_sent(m);
    tp_pipe_unref(pc);
    tp_pipe_unref(pd);
    tp_test_pair_close(&pr);
}

// A descriptor read with a timeout and nothing to read times out without
// hurting the pipe.
static void
test_read_timeout_keeps_pipe(void)
{
    tp_test_pair pr;
    pair_open(&pr);
    op rd;
    op_init(&rd, 100);
    tp_pipe_read_descriptor(pr.pa, rd.aio);
    op_wait(&rd, WAIT_MS);
    TP_CHECK_EQ(tp_aio_status(rd.aio), TP_ETIMEDOUT);
    op_fini(&rd);
    uint64_t sz = 1000;
    tp_message *m = make_msg(0, NULL, 1, &sz, 3);
    send_recv(pr.pb, pr.pa, m, 0, NULL, 1, &sz, 3);
    free_sent(m);
    tp_test_pair_close(&pr);
}

// Destroying contexts with pipes and operations pending completes them.
static void
test_destroy_with_pending(void)
{
    tp_test_pair pr;
    pair_open(&pr);
    op rd;
    op_init(&rd, 0);
    tp_pipe_read_descriptor(pr.pa, rd.aio);
    tp_context_destroy(pr.a);
    op_wait(&rd, WAIT_MS);
    TP_CHECK_EQ(tp_aio_status(rd.aio), TP_ECLOSED);
    op_fini(&rd);
    tp_pipe_unref(pr.pa);
    tp_pipe_unref(pr.pb);
    tp_pipe_listener_destroy(NULL);
    tp_context_destroy(pr.b);
}

// Bad input from the user: a clear error, the pipe keeps working.
static void
test_bad_user_input(void)
{
    tp_test_pair pr;
    pair_open(&pr);
    tp_message *m = NULL;
    TP_CHECK_OK(tp_message_create(0, 1, &m), NULL);
    m->tensors[0].len = 10; // data NULL
    op w;
    op_init(&w, WAIT_MS);
    tp_pipe_write(pr.pb, m, w.aio);
    op_wait(&w, WAIT_MS);
    TP_CHECK_EQ(tp_aio_status(w.aio), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(tp_aio_error(w.aio)), "tensor 0");
    op_fini(&w);
    // tp_pipe_read without a descriptor.
    op r;
    op_init(&r, WAIT_MS);
    tp_pipe_read(pr.pa, m, r.aio);
    op_wait(&r, WAIT_MS);
    TP_CHECK_EQ(tp_aio_status(r.aio), TP_EINVAL);
    op_fini(&r);
    tp_message_destroy(m);
    uint64_t sz = 77;
    tp_message *ok = make_msg(0, NULL, 1, &sz, 4);
    send_recv(pr.pb, pr.pa, ok, 0, NULL, 1, &sz, 4);
    free_sent(ok);
    tp_test_pair_close(&pr);
}

static void
test_options_errors(void)
{
    tp_context_options o;
    tp_context_options_init(&o);
    o.transports = "tcp,carrier-pigeon";
    tp_context *ctx = NULL;
    tp_error *err = NULL;
    TP_CHECK_EQ(tp_context_create(&o, &ctx, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "carrier-pigeon");
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "known: shm, tcp");
    tp_error_unref(err);
    err = NULL;
    tp_context_options_init(&o);
    o.channels = "basic,warp";
    TP_CHECK_EQ(tp_context_create(&o, &ctx, &err), TP_EINVAL);
    // Every channel built, best first (cuda_ipc too, with CUDA).
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "(known: xth, ");
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "cma, mpt, basic)");
    tp_error_unref(err);
}

// The refusal names why: both ends allow nothing in common.
static void
test_no_common_channel(void)
{
    tp_context_options o;
    tp_context_options_init(&o);
    o.transports = "tcp";
    o.channels = "basic";
    o.name = "alice";
    tp_context *a = NULL, *b = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_context_create(&o, &a, &err), err);
    o.channels = "mpt";
    o.name = "bob";
    TP_CHECK_OK(tp_context_create(&o, &b, &err), err);
    const char *url = "tcp://127.0.0.1:0";
    tp_pipe_listener *l = NULL;
    TP_CHECK_OK(tp_context_listen(a, &url, 1, &l, &err), err);
    tp_pipe *p = NULL;
    TP_CHECK_OK(
        tp_context_connect(b, tp_pipe_listener_addr(l, "tcp"), &p, &err), err);
    TP_CHECK(tp_pipe_wait_ready(p, WAIT_MS, &err) != TP_OK);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "no channel");
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "alice");
    tp_error_unref(err);
    tp_pipe_unref(p);
    tp_pipe_listener_destroy(l);
    tp_context_destroy(b);
    tp_context_destroy(a);
}

// ---- across processes
// --------------------------------------------------------

typedef struct child_job {
    void (*fn)(tp_pipe *p);
} child_job;

// The child: waits for the URL, connects to it, then runs the job.
static void
child_main(tp_test_peer *self, void *arg)
{
    const child_job *job = arg;
    char url[512];
    if (!tp_test_peer_recv(self, url, sizeof(url), WAIT_MS)) {
        _exit(4);
    }
    tp_context *ctx = make_ctx("child");
    tp_pipe *p = NULL;
    tp_error *err = NULL;
    if (tp_context_connect(ctx, url, &p, &err) != TP_OK ||
        tp_pipe_wait_ready(p, WAIT_MS, &err) != TP_OK) {
        fprintf(stderr, "child: %s\n", tp_error_message(err));
        _exit(3);
    }
    job->fn(p);
    tp_pipe_unref(p);
    tp_context_destroy(ctx);
}

// Forks a child (before this process starts any thread: TSan does not
// support threads after a multi-threaded fork) that waits for a URL
// (tp_test_peer_send), connects to it, then runs @fn.
static void
spawn_child(tp_test_peer *child, void (*fn)(tp_pipe *p))
{
    child_job job = {fn};
    tp_test_peer_fork(child, "child", TP_TEST_PEER_DOWN, child_main, &job);
}

static void
child_echo(tp_pipe *p)
{
    // Echo messages until the pipe closes.
    for (;;) {
        tp_aio *aio = NULL;
        op rd;
        op_init(&rd, 0);
        aio = rd.aio;
        tp_pipe_read_descriptor(p, aio);
        if (!op_wait_for(&rd, WAIT_MS) || tp_aio_status(aio) != TP_OK) {
            op_fini(&rd);
            return;
        }
        tp_message *m = tp_aio_get_output(aio, 0);
        atomic_store(&rd.done, 0);
        tp_pipe_read(p, m, aio);
        if (!op_wait_for(&rd, WAIT_MS) || tp_aio_status(aio) != TP_OK) {
            op_fini(&rd);
            return;
        }
        atomic_store(&rd.done, 0);
        tp_pipe_write(p, m, aio);
        if (!op_wait_for(&rd, WAIT_MS) || tp_aio_status(aio) != TP_OK) {
            op_fini(&rd);
            return;
        }
        tp_message_destroy(m);
        op_fini(&rd);
    }
}

static void
test_cross_process_echo(void)
{
    if (in_process_only()) {
        tp_test_skip("channel xth works only within one process");
    }
    tp_test_peer child;
    spawn_child(&child, child_echo);
    tp_context *ctx = make_ctx("parent");
    tp_pipe_listener *l = make_listener(ctx);
    tp_test_peer_send(&child, tp_pipe_listener_addr(l, NULL));
    tp_pipe *p = op_pipe_accept(l, WAIT_MS);
    TP_CHECK(strcmp(tp_pipe_channel(p), ch_name()) == 0);
    static const uint64_t sizes[] = {
        0, 1, 64, 4096, 262145, 1 << 20, (64u << 20) + 3};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        uint64_t psz[1] = {33};
        tp_message *m = make_msg(1, psz, 1, &sizes[i], (uint32_t)i + 1);
        send_recv(p, p, m, 1, psz, 1, &sizes[i], (uint32_t)i + 1);
        free_sent(m);
    }
    tp_pipe_unref(p);
    tp_test_peer_wait(&child, WAIT_MS);
    tp_pipe_listener_destroy(l);
    tp_context_destroy(ctx);
}

static void
child_read_then_hang(tp_pipe *p)
{
    // Read one descriptor, never the data: the parent's write stays
    // pending until we are killed.
    op rd;
    op_init(&rd, 0);
    tp_pipe_read_descriptor(p, rd.aio);
    (void)op_wait_for(&rd, WAIT_MS);
    pause();
}

// A peer killed while a 64 MiB message is in flight: the write fails
// promptly with an error naming the peer; the listener keeps working.
static void
test_peer_killed(void)
{
    if (in_process_only()) {
        tp_test_skip("channel xth works only within one process");
    }
    tp_test_peer hang, echo;
    spawn_child(&hang, child_read_then_hang);
    spawn_child(&echo, child_echo);
    tp_context *ctx = make_ctx("parent");
    tp_pipe_listener *l = make_listener(ctx);
    tp_test_peer_send(&hang, tp_pipe_listener_addr(l, NULL));
    tp_pipe *p = op_pipe_accept(l, WAIT_MS);
    uint64_t sz = 64u << 20;
    tp_message *m = make_msg(0, NULL, 1, &sz, 5);
    op w;
    op_init(&w, 0);
    tp_pipe_write(p, m, w.aio);
    op rd;
    op_init(&rd, 0);
    tp_pipe_read_descriptor(p, rd.aio);
    usleep(200000);
    tp_test_peer_kill(&hang);
    uint64_t t0 = tp__now_ns();
    op_wait(&w, WAIT_MS);
    op_wait(&rd, WAIT_MS);
    uint64_t ms = (tp__now_ns() - t0) / 1000000u;
    TP_CHECKF(ms < 5000, "failure took %llu ms", (unsigned long long)ms);
    TP_CHECK(tp_aio_status(w.aio) != TP_OK);
    TP_CHECK(tp_aio_status(rd.aio) != TP_OK);
    TP_CHECK_STR_CONTAINS(tp_error_message(tp_aio_error(w.aio)), "child");
    op_fini(&w);
    op_fini(&rd);
    free_sent(m);
    tp_pipe_unref(p);
    // The listener still accepts.
    tp_test_peer_send(&echo, tp_pipe_listener_addr(l, NULL));
    p = op_pipe_accept(l, WAIT_MS);
    uint64_t one = 100;
    tp_message *m2 = make_msg(0, NULL, 1, &one, 6);
    send_recv(p, p, m2, 0, NULL, 1, &one, 6);
    free_sent(m2);
    tp_pipe_unref(p);
    tp_test_peer_wait(&echo, WAIT_MS);
    tp_pipe_listener_destroy(l);
    tp_context_destroy(ctx);
}

// One tensor above 2 GiB (lengths are 64-bit end to end; cma splits its
// reads below 2 GiB). Runs with TP_PIPE_HUGE=1 (label slow: 4+ GiB).
static void
test_above_2gib(void)
{
    if (getenv("TP_PIPE_HUGE") == NULL) {
        tp_test_skip("set TP_PIPE_HUGE=1 (needs 4.1 GiB of memory)");
    }
    tp_test_pair pr;
    pair_open(&pr);
    uint64_t n = (2ull << 30) + (1u << 20) + 7;
    uint8_t *src = malloc(n);
    uint8_t *dst = malloc(n);
    TP_CHECK(src != NULL && dst != NULL);
    // Every 4 KiB page carries its index; the rest is a constant.
    memset(src, 0x5a, n);
    memset(dst, 0, n);
    for (uint64_t off = 0; off + 8 <= n; off += 4096) {
        memcpy(src + off, &off, 8);
    }
    tp_message *m = NULL;
    TP_CHECK_OK(tp_message_create(0, 1, &m), NULL);
    m->tensors[0].data = src;
    m->tensors[0].len = n;
    op w, r;
    op_init(&w, 120000);
    op_init(&r, 120000);
    tp_pipe_write(pr.pb, m, w.aio);
    tp_pipe_read_descriptor(pr.pa, r.aio);
    op_wait(&r, 120000);
    TP_CHECK_OK(tp_aio_status(r.aio), tp_aio_error(r.aio));
    tp_message *in = tp_aio_get_output(r.aio, 0);
    TP_CHECK_EQ(in->tensors[0].len, n);
    in->tensors[0].data = dst;
    atomic_store(&r.done, 0);
    tp_pipe_read(pr.pa, in, r.aio);
    op_wait(&r, 120000);
    TP_CHECK_OK(tp_aio_status(r.aio), tp_aio_error(r.aio));
    op_wait(&w, 120000);
    TP_CHECK_OK(tp_aio_status(w.aio), tp_aio_error(w.aio));
    TP_CHECK(memcmp(src, dst, n) == 0);
    tp_message_destroy(in);
    tp_message_destroy(m);
    op_fini(&w);
    op_fini(&r);
    free(src);
    free(dst);
    tp_test_pair_close(&pr);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE(test_options_errors),
    TP_TEST_CASE(test_no_common_channel),
    TP_TEST_CASE(test_negotiates_pair),
    TP_TEST_CASE_T(test_shapes, 60),
    TP_TEST_CASE_T(test_ordering, 60),
    TP_TEST_CASE_T(test_many_parts, 60),
    TP_TEST_CASE_T(test_256mib_in_process, 120),
    TP_TEST_CASE(test_close_pending),
    TP_TEST_CASE(test_read_timeout_keeps_pipe),
    TP_TEST_CASE(test_destroy_with_pending),
    TP_TEST_CASE(test_bad_user_input),
    TP_TEST_CASE_T(test_cross_process_echo, 60),
    TP_TEST_CASE_T(test_peer_killed, 60),
    TP_TEST_CASE_T(test_above_2gib, 280),
};

// Why @t and @c cannot be tested together here, or "" when they can.
static void
pair_skip(const tp_config *cfg, const tp_transport_ops *t,
          const tp_channel_ops *c, char *out, size_t len)
{
    char why[400];
    bool lanes = false;
    if (!t->is_viable(cfg, why, sizeof(why))) {
        snprintf(out, len, "transport %s is not viable here: %s", t->name, why);
    } else if (!(c->devices & TP_CHAN_DEV_CPU_CPU)) {
        snprintf(out, len,
                 "channel %s carries no cpu-cpu tensors (a device channel, "
                 "never the pipe's)",
                 c->name);
    } else if (!c->is_viable(cfg, why, sizeof(why))) {
        snprintf(out, len, "channel %s is not viable here: %s", c->name, why);
    } else if ((void)c->nconns(cfg, &lanes),
               lanes && !(t->props & TP_TRANSPORT_PROP_NETWORK)) {
        snprintf(out, len,
                 "channel %s takes network lanes, never chosen over %s, "
                 "which does not reach other hosts",
                 c->name, t->name);
    } else {
        out[0] = '\0';
    }
}

static int
pipe_over_registry(int argc, char **argv)
{
    tp_config cfg;
    tp_error *err = NULL;
    if (tp__config_load(&cfg, &err) != TP_OK) {
        fprintf(stderr, "pipe_test: configuration: %s\n",
                tp_error_message(err));
        tp_error_unref(err);
        return 1;
    }
    const char *only_t = getenv("TP_PIPE_TRANSPORT");
    const char *only_c = getenv("TP_PIPE_CHANNEL");
    size_t nt, nc, n = 0;
    const tp_transport_ops *const *treg = tp__transport_registry(&nt);
    const tp_channel_ops *const *creg = tp__channel_registry(&nc);
    tp_test_variant *v = calloc(nt * nc, sizeof(*v));
    TP_CHECK(v != NULL);
    for (size_t i = 0; i < nt; i++) {
        if (only_t != NULL && *only_t && strcmp(only_t, treg[i]->name) != 0) {
            continue;
        }
        for (size_t j = 0; j < nc; j++) {
            if (only_c != NULL && *only_c &&
                strcmp(only_c, creg[j]->name) != 0) {
                continue;
            }
            tp_test_variant *x = &v[n++];
            snprintf(x->tv_label, sizeof(x->tv_label), "%s+%s", treg[i]->name,
                     creg[j]->name);
            pair_skip(&cfg, treg[i], creg[j], x->tv_skip, sizeof(x->tv_skip));
            tp_test_variant_env(x, "TP_PIPE_TRANSPORT", treg[i]->name);
            tp_test_variant_env(x, "TP_PIPE_CHANNEL", creg[j]->name);
        }
    }
    int rc =
        n == 0 ? 77 : tp_test_run_variants("pipe_test", argc, argv, v, n, 600);
    if (n == 0) {
        printf("pipe_test: no pair of the registries matches "
               "TP_PIPE_TRANSPORT=%s TP_PIPE_CHANNEL=%s\n",
               only_t ? only_t : "", only_c ? only_c : "");
    }
    free(v);
    return rc;
}

int
main(int argc, char **argv)
{
    const char *t = getenv("TP_PIPE_TRANSPORT");
    const char *c = getenv("TP_PIPE_CHANNEL");
    bool list = argc > 1 && strcmp(argv[1], "--list") == 0;
    tp_test_install_fakes(); // before the registry's is_viable
    if ((t != NULL && *t && c != NULL && *c) || list) {
        return tp_test_main(argc, argv, cases,
                            sizeof(cases) / sizeof(cases[0]));
    }
    return pipe_over_registry(argc, argv);
}
