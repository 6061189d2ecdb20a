// SPDX-License-Identifier: Apache-2.0
// rpc_caps_test.c - the agent's caps on what a peer can make it allocate
// (max_message_bytes, max_peer_inflight_bytes), worker processes on
// loopback, with caps small enough to test (2 MiB per message, 3 MiB in
// flight per peer):
//   - a raw pipe announcing a 64 MiB tensor is refused before anything is
//     allocated: the pipe closes, alpha's RSS does not grow, its log line
//     names the peer, the size and the cap; calls under the cap work, a
//     call above it fails on the caller (TP_EINVAL);
//   - a second message while a first one is held in its handler passes
//     the bytes in flight of that peer: the pipe closes naming the cap,
//     and once the first is released calls work again.

#include "tp_test.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tpipe/aio.h>
#include <tpipe/log.h>
#include <tpipe/pipe.h>
#include <tpipe/rpc.h>

#include "agent/agent_int.h"
#include "core/hash.h"
#include "tp_test_job.h"

#define WAIT_MS 20000
#define MSG_CAP (2u << 20)

static const char *const k_names[2] = {"alpha", "bravo"};

// ---- alpha's side: functions and its log --------------------------------

static pthread_mutex_t g_mtx = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static char g_log[8192];
static bool g_released, g_hold_done, g_done;

static void
log_cb(tp_log_level level, const char *id, const char *msg, void *arg)
{
    (void)arg;
    if (getenv("TP_CAPS_TEST_VERBOSE") != NULL) {
        fprintf(stderr, "alpha log %s: %s\n", id, msg);
    }
    if (level > TP_LOG_LEVEL_WARN || strcmp(id, "TP-RPC-PROTO") != 0) {
        return;
    }
    pthread_mutex_lock(&g_mtx);
    size_t n = strlen(g_log);
    snprintf(g_log + n, sizeof(g_log) - n, "%s\n", msg);
    pthread_mutex_unlock(&g_mtx);
}

static tp_status
bytes_result(const void *p, size_t n, tp_args **out_p)
{
    return tp_args_create(p, n, out_p);
}

static tp_status
fn_url(const tp_rpc_call_info *ci, const tp_args *in, void *arg,
       tp_args **out_p, tp_error **err_p)
{
    const char *u = tp__agent_listen_url(ci->agent);
    return bytes_result(u, strlen(u), out_p);
}

// This process's resident set in bytes.
static int64_t
rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long size = 0, res = 0;
    if (f != NULL) {
        if (fscanf(f, "%ld %ld", &size, &res) != 2) {
            res = 0;
        }
        fclose(f);
    }
    return (int64_t)res * 4096;
}

static tp_status
fn_rss(const tp_rpc_call_info *ci, const tp_args *in, void *arg,
       tp_args **out_p, tp_error **err_p)
{
    int64_t v = rss_bytes();
    return bytes_result(&v, sizeof(v), out_p);
}

static tp_status
fn_log(const tp_rpc_call_info *ci, const tp_args *in, void *arg,
       tp_args **out_p, tp_error **err_p)
{
    pthread_mutex_lock(&g_mtx);
    tp_status st = bytes_result(g_log, strlen(g_log), out_p);
    pthread_mutex_unlock(&g_mtx);
    return st;
}

// Holds its arguments (and so its bytes in flight) until t.release.
static tp_status
fn_hold(const tp_rpc_call_info *ci, const tp_args *in, void *arg,
        tp_args **out_p, tp_error **err_p)
{
    int64_t end = tp_job_now_ms() + tp_test_ms(WAIT_MS);
    pthread_mutex_lock(&g_mtx);
    while (!g_released && tp_job_now_ms() < end) {
        pthread_mutex_unlock(&g_mtx);
        tp_job_sleep_ms(5);
        pthread_mutex_lock(&g_mtx);
    }
    g_hold_done = true;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mtx);
    return TP_OK;
}

// Releases t.hold and returns once its handler returned.
static tp_status
fn_release(const tp_rpc_call_info *ci, const tp_args *in, void *arg,
           tp_args **out_p, tp_error **err_p)
{
    int64_t end = tp_job_now_ms() + tp_test_ms(WAIT_MS);
    pthread_mutex_lock(&g_mtx);
    g_released = true;
    while (!g_hold_done && tp_job_now_ms() < end) {
        pthread_mutex_unlock(&g_mtx);
        tp_job_sleep_ms(5);
        pthread_mutex_lock(&g_mtx);
    }
    bool done = g_hold_done;
    pthread_mutex_unlock(&g_mtx);
    // The request's bytes are given back right after its reply is sent.
    tp_job_sleep_ms(100);
    return done ? TP_OK : TP_ETIMEDOUT;
}

static tp_status
fn_done(const tp_rpc_call_info *ci, const tp_args *in, void *arg,
        tp_args **out_p, tp_error **err_p)
{
    pthread_mutex_lock(&g_mtx);
    g_done = true;
    pthread_mutex_unlock(&g_mtx);
    return TP_OK;
}

// alpha: waits until bravo is done before the shutdown agreement (a pipe
// alpha closed on bravo makes it take bravo for dead until it hears from
// it again).
static void
wait_done(void)
{
    int64_t end = tp_job_now_ms() + tp_test_ms(WAIT_MS);
    pthread_mutex_lock(&g_mtx);
    while (!g_done && tp_job_now_ms() < end) {
        pthread_mutex_unlock(&g_mtx);
        tp_job_sleep_ms(5);
        pthread_mutex_lock(&g_mtx);
    }
    bool done = g_done;
    pthread_mutex_unlock(&g_mtx);
    TP_CHECKF(done, "bravo never said it was done");
}

static void
setup(int rank)
{
    if (rank == 0) {
        tp_log_set_handler(log_cb, NULL);
        tp_log_set_level(TP_LOG_LEVEL_WARN);
    }
    TP_CHECK_OK(tp_rpc_register("t.url", fn_url, NULL, NULL), NULL);
    TP_CHECK_OK(tp_rpc_register("t.rss", fn_rss, NULL, NULL), NULL);
    TP_CHECK_OK(tp_rpc_register("t.log", fn_log, NULL, NULL), NULL);
    TP_CHECK_OK(tp_rpc_register("t.hold", fn_hold, NULL, NULL), NULL);
    TP_CHECK_OK(tp_rpc_register("t.release", fn_release, NULL, NULL), NULL);
    TP_CHECK_OK(tp_rpc_register("t.done", fn_done, NULL, NULL), NULL);
}

// ---- bravo's side --------------------------------------------------------

static tp_args *
call_ok(tp_agent *a, const char *fn, tp_args *in)
{
    tp_args *out = NULL;
    tp_error *err = NULL;
    tp_status st = tp_rpc_sync(a, "alpha", fn, in, WAIT_MS, &out, &err);
    TP_CHECKF(st == TP_OK, "%s: %s", fn, tp_error_message(err));
    return out;
}

static char *
call_str(tp_agent *a, const char *fn)
{
    tp_args *r = call_ok(a, fn, NULL);
    size_t n = 0;
    const char *p = tp_args_bytes(r, &n);
    char *s = calloc(1, n + 1);
    TP_CHECK(s != NULL);
    memcpy(s, p, n);
    tp_args_unref(r);
    return s;
}

static int64_t
call_i64(tp_agent *a, const char *fn)
{
    tp_args *r = call_ok(a, fn, NULL);
    size_t n = 0;
    const void *p = tp_args_bytes(r, &n);
    int64_t v = 0;
    TP_CHECK_EQ(n, sizeof(v));
    memcpy(&v, p, sizeof(v));
    tp_args_unref(r);
    return v;
}

static tp_args *
args_bytes(size_t n)
{
    tp_args *in = NULL;
    TP_CHECK_OK(tp_args_create(NULL, 0, &in), NULL);
    int64_t shape[1] = {(int64_t)n};
    tp_tensor *t = NULL;
    TP_CHECK_OK(tp_tensor_empty(TP_U8, 1, shape, &t, NULL), NULL);
    memset(tp_tensor_data(t), 7, n);
    TP_CHECK_OK(tp_args_add_tensor(in, t), NULL);
    tp_tensor_unref(t);
    return in;
}

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

static void
aio_nop(void *arg)
{
    (void)arg;
}

// Sends alpha (at @url) a REQUEST of "tp.echo" from rank 1 announcing one
// u8 tensor of @nbytes, on a raw pipe, and checks alpha closes the pipe
// instead of answering.
static void
raw_send_huge(const char *url, uint64_t nbytes)
{
    tp_context_options co;
    tp_context_options_init(&co);
    co.name = "mallory";
    tp_context *ctx = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_context_create(&co, &ctx, &err), err);
    tp_pipe *p = NULL;
    TP_CHECK_OK(tp_context_connect(ctx, url, &p, &err), err);
    TP_CHECK_OK(tp_pipe_wait_ready(p, tp_test_ms(WAIT_MS), &err), err);

    static const char fn[] = "tp.echo";
    uint8_t meta[64 + sizeof(fn)];
    memset(meta, 0, sizeof(meta));
    put32(meta, 0x41525054u); // "TPRA"
    meta[4] = 2;              // version
    meta[5] = 1;              // REQUEST
    meta[6] = (uint8_t)(sizeof(fn) - 1);
    put64(meta + 8, 1);                    // call id
    put64(meta + 16, tp__hash64_str("x")); // the fn id does not matter
    put32(meta + 28, 1);                   // one tensor
    put32(meta + 36, 1);                   // from rank 1
    memcpy(meta + 40, fn, sizeof(fn) - 1); // name
    size_t off = 40 + sizeof(fn) - 1;
    meta[off] = (uint8_t)TP_U8;
    meta[off + 1] = 1; // ndim
    put64(meta + off + 8, nbytes);
    size_t mlen = off + 16;

    uint8_t *buf = calloc(1, nbytes);
    TP_CHECK(buf != NULL);
    tp_message *m = NULL;
    TP_CHECK_OK(tp_message_create(0, 1, &m), NULL);
    m->metadata = meta;
    m->metadata_len = mlen;
    m->tensors[0].data = buf;
    m->tensors[0].len = nbytes;
    tp_aio *w = NULL, *r = NULL;
    TP_CHECK_OK(tp_aio_create(aio_nop, NULL, &w), NULL);
    TP_CHECK_OK(tp_aio_create(aio_nop, NULL, &r), NULL);
    tp_aio_set_timeout(w, tp_test_ms(WAIT_MS));
    tp_aio_set_timeout(r, tp_test_ms(WAIT_MS));
    tp_pipe_write(p, m, w);
    tp_pipe_read_descriptor(p, r);
    tp_aio_wait(r);
    tp_status st = tp_aio_status(r);
    TP_CHECKF(st != TP_OK && st != TP_ETIMEDOUT,
              "alpha answered (or kept the pipe open) instead of closing "
              "it: %s",
              tp_status_name(st));
    if (st == TP_OK) {
        tp_message_destroy(tp_aio_get_output(r, 0));
    }
    tp_aio_wait(w);
    tp_aio_destroy(w);
    tp_aio_destroy(r);
    m->metadata = NULL;
    m->metadata_len = 0;
    m->tensors[0].data = NULL;
    tp_message_destroy(m);
    free(buf);
    tp_pipe_close(p);
    tp_pipe_unref(p);
    tp_context_destroy(ctx);
}

static void
w_raw(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_agent *a =
        tp_job_rpc_join(k_names[rank], rank, world, url, WAIT_MS, WAIT_MS);
    if (rank == 0) {
        wait_done();
        tp_job_rpc_leave(a, rank);
        return;
    }
    char *aurl = call_str(a, "t.url");
    int64_t rss0 = call_i64(a, "t.rss");
    raw_send_huge(aurl, 64u << 20);
    free(aurl);
    int64_t rss1 = call_i64(a, "t.rss");
    printf("alpha's rss: %lld KiB before, %lld KiB after\n",
           (long long)(rss0 >> 10), (long long)(rss1 >> 10));
    TP_CHECKF(rss1 - rss0 < (32 << 20),
              "alpha's RSS grew by %lld KiB for a refused message",
              (long long)((rss1 - rss0) >> 10));
    char *log = call_str(a, "t.log");
    printf("alpha's log:\n%s", log);
    TP_CHECK_STR_CONTAINS(log, "bravo (rank 1)");
    TP_CHECK_STR_CONTAINS(log, "67108864 bytes");
    TP_CHECK_STR_CONTAINS(log, "cap of 2097152 bytes per message");
    TP_CHECK_STR_CONTAINS(log, "TP_RPC_MAX_MESSAGE_BYTES");
    free(log);

    // Under the cap: works.
    tp_args *in = args_bytes(1u << 20);
    tp_args *out = call_ok(a, "tp.echo", in);
    TP_CHECK_EQ(tp_args_ntensors(out), 1u);
    TP_CHECK_EQ(tp_tensor_nbytes(tp_args_tensor(out, 0)), 1u << 20);
    tp_args_unref(out);
    tp_args_unref(in);
    // Above it: fails here, before anything is sent.
    in = args_bytes(3u << 20);
    tp_error *err = NULL;
    tp_status st = tp_rpc_sync(a, "alpha", "tp.echo", in, WAIT_MS, NULL, &err);
    TP_CHECK_EQ(st, TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "max_message_bytes");
    tp_error_unref(err);
    tp_args_unref(in);
    tp_args_unref(call_ok(a, "t.done", NULL));
    tp_job_rpc_leave(a, rank);
}

static void
test_message_cap(void)
{
    tp_job j;
    tp_job_tcp(&j, 2, w_raw, NULL);
    j.names = k_names;
    j.setup = setup;
    j.env[0] = "TP_RPC_MAX_MESSAGE_BYTES=2M";
    j.env[1] = "TP_RPC_MAX_PEER_INFLIGHT_BYTES=3MiB";
    tp_job_run(&j);
}

static void
w_inflight(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_agent *a =
        tp_job_rpc_join(k_names[rank], rank, world, url, WAIT_MS, WAIT_MS);
    if (rank == 0) {
        wait_done();
        tp_job_rpc_leave(a, rank);
        return;
    }
    tp_args *in = args_bytes(3u << 19); // 1.5 MiB
    tp_future *f1 = tp_rpc_async(a, "alpha", "t.hold", in, WAIT_MS);
    tp_job_sleep_ms(300); // t.hold holds its 1.5 MiB
    tp_future *f2 = tp_rpc_async(a, "alpha", "tp.echo", in, WAIT_MS);
    tp_error *err = NULL;
    tp_status st1 = tp_rpc_wait(f1, tp_test_ms(WAIT_MS), NULL, &err);
    printf("held call: %s: %s\n", tp_status_name(st1), tp_error_message(err));
    TP_CHECK(TP_STATUS_IS_CONN(st1));
    tp_error_unref(err);
    err = NULL;
    tp_status st2 = tp_rpc_wait(f2, tp_test_ms(WAIT_MS), NULL, &err);
    TP_CHECK(TP_STATUS_IS_CONN(st2));
    tp_error_unref(err);
    tp_future_unref(f1);
    tp_future_unref(f2);
    char *log = call_str(a, "t.log");
    printf("alpha's log:\n%s", log);
    TP_CHECK_STR_CONTAINS(log, "bravo (rank 1)");
    TP_CHECK_STR_CONTAINS(log, "cap of 3145728 bytes in flight per peer");
    TP_CHECK_STR_CONTAINS(log, "TP_RPC_MAX_PEER_INFLIGHT_BYTES");
    free(log);
    // Once t.hold let go of its bytes, the same call works.
    tp_args_unref(call_ok(a, "t.release", NULL));
    tp_args *out = call_ok(a, "tp.echo", in);
    TP_CHECK_EQ(tp_tensor_nbytes(tp_args_tensor(out, 0)), 3u << 19);
    tp_args_unref(out);
    tp_args_unref(in);
    tp_args_unref(call_ok(a, "t.done", NULL));
    tp_job_rpc_leave(a, rank);
}

static void
test_inflight_cap(void)
{
    tp_job j;
    tp_job_tcp(&j, 2, w_inflight, NULL);
    j.names = k_names;
    j.setup = setup;
    j.env[0] = "TP_RPC_MAX_MESSAGE_BYTES=2M";
    j.env[1] = "TP_RPC_MAX_PEER_INFLIGHT_BYTES=3M";
    tp_job_run(&j);
}

// Malformed or inconsistent caps fail init, naming the variable.
static void
test_bad_options(void)
{
    tp_agent_options o;
    setenv("TP_RPC_MAX_MESSAGE_BYTES", "8Q", 1);
    tp_agent_options_init(&o);
    o.init_method = "tcp://127.0.0.1:1";
    tp_agent *a = NULL;
    tp_error *err = NULL;
    tp_status st = tp_rpc_init("alpha", 0, 1, &o, &a, &err);
    TP_CHECK_EQ(st, TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "TP_RPC_MAX_MESSAGE_BYTES");
    tp_error_unref(err);
    err = NULL;
    unsetenv("TP_RPC_MAX_MESSAGE_BYTES");
    tp_agent_options_init(&o);
    TP_CHECK_EQ(o.max_message_bytes, 8ull << 30);
    TP_CHECK_EQ(o.max_peer_inflight_bytes, 16ull << 30);
    o.init_method = "tcp://127.0.0.1:1";
    o.max_peer_inflight_bytes = 1u << 20;
    st = tp_rpc_init("alpha", 0, 1, &o, &a, &err);
    TP_CHECK_EQ(st, TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "max_peer_inflight_bytes");
    tp_error_unref(err);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE(test_bad_options),
    TP_TEST_CASE_T(test_message_cap, 60),
    TP_TEST_CASE_T(test_inflight_cap, 60),
};

TP_TEST_MAIN(cases)
