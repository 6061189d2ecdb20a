// SPDX-License-Identifier: Apache-2.0
// rpc_malformed_test.c - a raw pipe sending malformed agent messages to an
// RPC worker: each one makes the agent close that pipe (or answer with an
// error first), and the worker keeps serving its real peer.
// TP_RPC_TEST_VERBOSE=1 names each malformed message as it is sent;
// TP_RPC_TEST_GARBAGE=<substring> sends only those whose name contains it.

#include "rpc_common.h"

#include <stdlib.h>
#include <string.h>

#include <tpipe/pipe.h>

#include "core/hash.h"
#include "tp_test_op.h"

// ---- cases: a raw pipe sending malformed agent messages ---------------------

static void
put32(uint8_t *b, uint32_t v)
{
    for (int i = 0; i < 4; i++) {
        b[i] = (uint8_t)(v >> (8 * i));
    }
}

static void
put64(uint8_t *b, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        b[i] = (uint8_t)(v >> (8 * i));
    }
}

// An agent header (agent/wire.h): 40 bytes, then the function name.
static size_t
hdr(uint8_t *b, uint32_t magic, uint8_t ver, uint8_t kind, const char *fn,
    uint16_t fn_len, uint32_t ntensors, uint32_t ext_len, uint32_t src)
{
    memset(b, 0, 40);
    put32(b, magic);
    b[4] = ver;
    b[5] = kind;
    b[6] = (uint8_t)fn_len;
    b[7] = (uint8_t)(fn_len >> 8);
    put64(b + 8, 77);
    put64(b + 16, fn ? tp__hash64_str(fn) : 0);
    put32(b + 24, 0);
    put32(b + 28, ntensors);
    put32(b + 32, ext_len);
    put32(b + 36, src);
    size_t n = 40;
    if (fn != NULL) {
        memcpy(b + 40, fn, strlen(fn));
        n += strlen(fn);
    }
    return n;
}

#define MAGIC 0x41525054u
// The agent's wire version (agent/wire.h): every case but "wrong version"
// must pass the version check to reach the check it names.
#define WIRE_VER 2

// The agent must close @p: reads fail (not time out) within 5 s. It may
// answer up to @replies messages first.
static void
expect_closed(tp_pipe *p, const char *what, int replies)
{
    for (int i = 0;; i++) {
        op rd;
        op_init(&rd, 5000);
        tp_pipe_read_descriptor(p, rd.aio);
        op_wait(&rd, 10000);
        tp_status st = tp_aio_status(rd.aio);
        tp_message *m = st == TP_OK ? tp_aio_get_output(rd.aio, 0) : NULL;
        op_fini(&rd);
        if (st != TP_OK) {
            TP_CHECKF(st != TP_ETIMEDOUT,
                      "%s: the agent kept the pipe open for 5 s", what);
            return;
        }
        TP_CHECKF(i < replies, "%s: the agent answered instead of closing",
                  what);
        op r2;
        op_init(&r2, 5000);
        tp_pipe_read(p, m, r2.aio);
        op_wait(&r2, 10000);
        op_fini(&r2);
        tp_message_destroy(m);
    }
}

// Sends one message (metadata, @npay payloads and @nt tensors of @blen
// bytes each) and checks the agent closes the pipe. The read is posted
// while the write is in flight (a tensor write may wait for the reader);
// the write's own result does not matter.
static void
send_expect_closed(tp_pipe *p, const void *meta, size_t len, uint32_t npay,
                   uint32_t nt, uint64_t blen, const char *what, int replies)
{
    tp_message *m = NULL;
    TP_CHECK_OK(tp_message_create(npay, nt, &m), NULL);
    uint8_t *buf = calloc(1, blen ? blen : 1);
    TP_CHECK(buf != NULL);
    m->metadata = (void *)meta;
    m->metadata_len = len;
    for (uint32_t i = 0; i < npay; i++) {
        m->payloads[i].data = buf;
        m->payloads[i].len = blen;
    }
    for (uint32_t i = 0; i < nt; i++) {
        m->tensors[i].data = buf;
        m->tensors[i].len = blen;
    }
    op w;
    op_init(&w, 5000);
    tp_pipe_write(p, m, w.aio);
    expect_closed(p, what, replies);
    op_wait(&w, 10000);
    op_fini(&w);
    m->metadata = NULL;
    m->metadata_len = 0;
    tp_message_destroy(m);
    free(buf);
}

typedef struct garbage {
    const char *what;
    uint8_t meta[600];
    size_t len;
    uint32_t npay, nt;
    uint64_t blen;
    int replies; // answers allowed before the close
} garbage;

static int
make_garbage(garbage *g, int max)
{
    int n = 0;
    uint32_t seed = 12345;
    // Random bytes of a few lengths.
    for (size_t len = 1; len <= 512 && n < max; len *= 8) {
        garbage *x = &g[n++];
        memset(x, 0, sizeof(*x));
        x->what = "random bytes";
        x->len = len;
        for (size_t i = 0; i < len; i++) {
            seed = seed * 1103515245u + 12345u;
            x->meta[i] = (uint8_t)(seed >> 16);
        }
    }
    garbage *x = &g[n++];
    memset(x, 0, sizeof(*x));
    x->what = "no metadata";
    x = &g[n++];
    memset(x, 0, sizeof(*x));
    x->what = "truncated header";
    hdr(x->meta, MAGIC, WIRE_VER, 1, "tp.echo", 7, 0, 0, 1);
    x->len = 20;
    x = &g[n++];
    memset(x, 0, sizeof(*x));
    x->what = "wrong magic";
    x->len = hdr(x->meta, 0x45564f4cu, 1, 1, "tp.echo", 7, 0, 0, 1);
    x->npay = 1;
    x = &g[n++];
    memset(x, 0, sizeof(*x));
    x->what = "wrong version";
    x->len = hdr(x->meta, MAGIC, 99, 1, "tp.echo", 7, 0, 0, 1);
    x->npay = 1;
    x = &g[n++];
    memset(x, 0, sizeof(*x));
    x->what = "unknown kind";
    x->len = hdr(x->meta, MAGIC, WIRE_VER, 200, "tp.echo", 7, 0, 0, 1);
    x->npay = 1;
    x = &g[n++];
    memset(x, 0, sizeof(*x));
    x->what = "kind 16 (RREF_REMOTE) without its section";
    x->len = hdr(x->meta, MAGIC, WIRE_VER, 16, "tp.echo", 7, 0, 0, 1);
    x->npay = 1;
    x = &g[n++];
    memset(x, 0, sizeof(*x));
    x->what = "huge ntensors";
    x->len = hdr(x->meta, MAGIC, WIRE_VER, 1, "tp.echo", 7, 0xffffffffu, 0, 1);
    x->npay = 1;
    x = &g[n++];
    memset(x, 0, sizeof(*x));
    x->what = "ntensors above the pipe's";
    x->len = hdr(x->meta, MAGIC, WIRE_VER, 1, "tp.echo", 7, 3, 0, 1);
    x->npay = 1;
    x->nt = 1;
    x->blen = 8;
    x = &g[n++];
    memset(x, 0, sizeof(*x));
    x->what = "fn name past the end";
    x->len = hdr(x->meta, MAGIC, WIRE_VER, 1, "tp.echo", 60000, 0, 0, 1);
    x->npay = 1;
    x = &g[n++];
    memset(x, 0, sizeof(*x));
    x->what = "ext past the end";
    x->len = hdr(x->meta, MAGIC, WIRE_VER, 1, "tp.echo", 7, 0, 0xfffffff0u, 1);
    x->npay = 1;
    x = &g[n++];
    memset(x, 0, sizeof(*x));
    x->what = "bad tensor meta";
    x->len = hdr(x->meta, MAGIC, WIRE_VER, 1, "tp.echo", 7, 1, 0, 1);
    x->meta[x->len] = 250;    // dtype
    x->meta[x->len + 1] = 40; // ndim
    x->len += 8 + 8;
    x->npay = 1;
    x->nt = 1;
    x->blen = 8;
    x = &g[n++];
    memset(x, 0, sizeof(*x));
    x->what = "tensor size not the pipe's";
    x->len = hdr(x->meta, MAGIC, WIRE_VER, 1, "tp.echo", 7, 1, 0, 1);
    x->meta[x->len] = (uint8_t)TP_U8;
    x->meta[x->len + 1] = 1;
    put64(x->meta + x->len + 8, (uint64_t)1 << 40);
    x->len += 8 + 8;
    x->npay = 1;
    x->nt = 1;
    x->blen = 8;
    x = &g[n++];
    memset(x, 0, sizeof(*x));
    x->what = "bad fn name bytes";
    x->len = hdr(x->meta, MAGIC, WIRE_VER, 1, "tp echo\n", 8, 0, 0, 1);
    x->npay = 1;
    x->replies = 1; // an ERROR answer is fine too
    x = &g[n++];
    memset(x, 0, sizeof(*x));
    x->what = "src_rank out of range";
    x->len = hdr(x->meta, MAGIC, WIRE_VER, 1, "tp.echo", 7, 0, 0, 99);
    x->npay = 1;
    x->replies = 1;
    return n;
}

// A well-formed tp.echo request claiming rank @src (alpha is 0, bravo
// 1) on a pipe from a context named @ctxname: alpha closes the pipe
// without an answer unless the context is the worker it claims to be.
static void
claims_other_rank(const char *url0, const char *ctxname, uint32_t src)
{
    tp_context_options co;
    tp_context_options_init(&co);
    co.name = ctxname;
    tp_context *ctx = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_context_create(&co, &ctx, &err), err);
    tp_pipe *p = NULL;
    TP_CHECK_OK(tp_context_connect(ctx, url0, &p, &err), err);
    TP_CHECK_OK(tp_pipe_wait_ready(p, tp_test_ms(WAIT_MS), &err), err);
    uint8_t meta[128];
    size_t len = hdr(meta, MAGIC, WIRE_VER, 1, "tp.echo", 7, 0, 0, src);
    char what[96];
    snprintf(what, sizeof(what), "context %s claiming rank %u", ctxname,
             (unsigned)src);
    send_expect_closed(p, meta, len, 1, 0, 8, what, 0);
    tp_pipe_unref(p);
    tp_context_destroy(ctx);
}

static void
worker_garbage(int rank, int world, const char *url, void *arg)
{
    tp_agent *a = join(rank, world, url);
    if (rank == 0) {
        wait_release(2 * WAIT_MS);
        for (int i = 0; i < 20; i++) {
            tp_args *in = args_i64(i);
            tp_args *r = call_ok(a, "bravo", "tp.echo", in, WAIT_MS);
            TP_CHECK_EQ(want_i64(r), i);
            tp_args_unref(r);
            tp_args_unref(in);
        }
        leave(a);
        return;
    }
    tp_args *r = call_ok(a, "alpha", "t.url", NULL, WAIT_MS);
    size_t n = 0;
    const char *u = tp_args_bytes(r, &n);
    char url0[512];
    TP_CHECK(n > 0 && n < sizeof(url0));
    memcpy(url0, u, n);
    url0[n] = '\0';
    tp_args_unref(r);

    // The garbage comes from a context named like this worker, so that
    // each case reaches the check it names (a pipe's context must be the
    // worker its messages claim: claims_other_rank below).
    tp_context_options co;
    tp_context_options_init(&co);
    co.name = "bravo";
    tp_context *ctx = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_context_create(&co, &ctx, &err), err);
    static garbage g[32];
    int ng = make_garbage(g, 32);
    for (int i = 0; i < ng; i++) {
        const char *only = getenv("TP_RPC_TEST_GARBAGE");
        if (only != NULL && strstr(g[i].what, only) == NULL) {
            continue;
        }
        if (getenv("TP_RPC_TEST_VERBOSE") != NULL) {
            fprintf(stderr, "mallory: %s\n", g[i].what);
        }
        tp_pipe *p = NULL;
        TP_CHECK_OK(tp_context_connect(ctx, url0, &p, &err), err);
        tp_status st = tp_pipe_wait_ready(p, tp_test_ms(WAIT_MS), &err);
        TP_CHECKF(st == TP_OK, "%s: pipe to %s: %s", g[i].what, url0,
                  tp_error_message(err));
        send_expect_closed(p, g[i].meta, g[i].len, g[i].npay, g[i].nt,
                           g[i].blen, g[i].what, g[i].replies);
        tp_pipe_unref(p);
        // alpha still answers.
        tp_args *in = args_str(g[i].what);
        tp_args *e = call_ok(a, "alpha", "tp.echo", in, WAIT_MS);
        check_str(e, g[i].what);
        tp_args_unref(e);
        tp_args_unref(in);
    }
    // A pipe that connects and goes away without a word.
    tp_pipe *p = NULL;
    TP_CHECK_OK(tp_context_connect(ctx, url0, &p, &err), err);
    (void)tp_pipe_wait_ready(p, tp_test_ms(WAIT_MS), &err);
    tp_error_unref(err);
    tp_pipe_unref(p);
    tp_context_destroy(ctx);
    claims_other_rank(url0, "mallory", 1);
    claims_other_rank(url0, "bravo", 0);
    tp_args *in = args_str("after the garbage");
    r = call_ok(a, "alpha", "tp.echo", in, WAIT_MS);
    check_str(r, "after the garbage");
    tp_args_unref(r);
    tp_args_unref(in);
    release(a, 0);
    leave(a);
}

static void
test_malformed_peer(void)
{
    run_tcp(2, worker_garbage, NULL);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE_T(test_malformed_peer, 90),
};

TP_TEST_MAIN(cases)
