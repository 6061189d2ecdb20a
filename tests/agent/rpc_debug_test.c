// SPDX-License-Identifier: Apache-2.0
// rpc_debug_test.c - the flight recorder (flight_recorder,
// TP_RPC_FLIGHT_RECORDER), worker processes on loopback:
//   - after a few calls, tp_rpc_get_recent_ops and the debug info list
//     them on the caller (REQUEST, the callee, the bytes, done) and on the
//     callee (RESPONSE, the caller, the bytes);
//   - calls to a SIGSTOPped worker are listed as waiting for their reply;
//     one that times out logs a TP-RPC-TIMEOUT line naming the one still
//     in flight, and its record says timed out;
//   - the ring keeps the last N (wrapping), 0 turns it off, the variable
//     sets the option.

#include "tp_test.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tpipe/log.h>
#include <tpipe/rpc.h>
#include <tpipe/tensor.h>

#include "tp_test_job.h"

#define WAIT_MS 20000
#define NOPS    16

static const char *const k_names[2] = {"alpha", "bravo"};

// ---- the log of a worker

static pthread_mutex_t g_log_mtx = PTHREAD_MUTEX_INITIALIZER;
static char g_timeout_line[8192];
static int g_timeout_lines;

static void
log_sink(tp_log_level level, const char *id, const char *msg, void *arg)
{
    (void)level;
    (void)arg;
    fprintf(stderr, "[%s] %s\n", id, msg);
    if (strcmp(id, "TP-RPC-TIMEOUT") == 0) {
        pthread_mutex_lock(&g_log_mtx);
        if (g_timeout_lines++ == 0) {
            snprintf(g_timeout_line, sizeof(g_timeout_line), "%s", msg);
        }
        pthread_mutex_unlock(&g_log_mtx);
    }
}

// ---- "t.pid": the callee's process id (to stop it)

static tp_status
fn_pid(const tp_rpc_call_info *call, const tp_args *in, void *arg,
       tp_args **out_p, tp_error **err_p)
{
    (void)call;
    (void)in;
    (void)arg;
    (void)err_p;
    int pid = (int)getpid();
    return tp_args_create(&pid, sizeof(pid), out_p);
}

static void
setup(int rank)
{
    (void)rank;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_rpc_register("t.pid", fn_pid, NULL, &err), err);
}

// ---- helpers

static tp_args *
args_n(size_t nbytes, int64_t tensor_bytes)
{
    char buf[256];
    memset(buf, 'x', sizeof(buf));
    tp_args *x = NULL;
    TP_CHECK_EQ(tp_args_create(nbytes > 0 ? buf : NULL, nbytes, &x), TP_OK);
    if (tensor_bytes > 0) {
        tp_tensor *t = NULL;
        tp_error *err = NULL;
        TP_CHECK_OK(tp_tensor_empty(TP_U8, 1, &tensor_bytes, &t, &err), err);
        memset(tp_tensor_data(t), 7, (size_t)tensor_bytes);
        TP_CHECK_EQ(tp_args_add_tensor(x, t), TP_OK);
        tp_tensor_unref(t);
    }
    return x;
}

// The most recent record of @kind named @name ("" any), NULL if none.
static const tp_rpc_op_record *
find_op(const tp_rpc_op_record *ops, size_t n, const char *kind,
        const char *name, uint64_t bytes)
{
    for (size_t i = n; i-- > 0;) {
        if (strcmp(ops[i].kind, kind) == 0 &&
            (name[0] == '\0' || strcmp(ops[i].name, name) == 0) &&
            ops[i].bytes == bytes) {
            return &ops[i];
        }
    }
    return NULL;
}

// Waits until the record of call @id is in @state; false after @ms.
static bool
wait_state(tp_agent *a, uint64_t call_id, const char *kind,
           tp_rpc_op_state state, int64_t ms)
{
    int64_t end = tp_job_now_ms() + tp_test_ms(ms);
    for (;;) {
        tp_rpc_op_record ops[NOPS];
        size_t n = 0;
        TP_CHECK_EQ(tp_rpc_get_recent_ops(a, ops, NOPS, &n), TP_OK);
        for (size_t i = 0; i < n; i++) {
            if (ops[i].call_id == call_id && strcmp(ops[i].kind, kind) == 0 &&
                ops[i].state == state) {
                return true;
            }
        }
        if (tp_job_now_ms() > end) {
            return false;
        }
        tp_job_sleep_ms(5);
    }
}

static void
check_three(tp_agent *a, const char *kind, const char *peer, int rank)
{
    tp_rpc_op_record ops[NOPS];
    size_t n = 0;
    TP_CHECK_EQ(tp_rpc_get_recent_ops(a, ops, NOPS, &n), TP_OK);
    TP_CHECKF(n >= 3, "%zu records", n);
    static const struct {
        const char *name;
        uint64_t bytes;
    } want[] = {{"tp.noop", 0}, {"tp.echo", 100}, {"tp.echo", 1100}};
    for (size_t i = 0; i < 3; i++) {
        const tp_rpc_op_record *o =
            find_op(ops, n, kind, want[i].name, want[i].bytes);
        TP_CHECKF(o != NULL, "%s %s of %llu bytes is not recorded", kind,
                  want[i].name, (unsigned long long)want[i].bytes);
        if (o == NULL) {
            continue;
        }
        TP_CHECK(wait_state(a, o->call_id, kind, TP_RPC_OP_DONE, 2000));
        TP_CHECK_EQ(strcmp(o->peer.name, peer), 0);
        TP_CHECK_EQ(o->peer.rank, rank);
        TP_CHECK(o->start_us > 1600000000000000LL); // a wall-clock time
    }
    char *di = tp_rpc_get_debug_info(a);
    TP_CHECK(di != NULL);
    printf("%s", di);
    TP_CHECK_STR_CONTAINS(di, "flight recorder: last ");
    char line[160];
    snprintf(line, sizeof(line), "%s \"tp.echo\"", kind);
    TP_CHECK_STR_CONTAINS(di, line);
    snprintf(line, sizeof(line), "to %s (rank %d), 1100 bytes, done", peer,
             rank);
    TP_CHECK_STR_CONTAINS(di, line);
    free(di);
}

// ---- calls, then a stopped callee

static tp_job_latch g_calls_done, g_checked;

static void
w_ops(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    if (rank == 0) {
        tp_log_set_handler(log_sink, NULL);
        tp_log_set_level(TP_LOG_LEVEL_WARN);
    }
    tp_agent *a =
        tp_job_rpc_join(k_names[rank], rank, world, url, WAIT_MS, WAIT_MS);
    if (rank == 1) {
        TP_CHECK_EQ(tp_job_latch_wait(&g_calls_done, 1, WAIT_MS), 1);
        check_three(a, "RESPONSE", "alpha", 0);
        tp_job_latch_post(&g_checked);
        // Stopped by alpha, then killed by the harness.
        tp_job_sleep_ms(tp_test_ms(4 * WAIT_MS));
        TP_CHECK(false);
        return;
    }
    tp_error *err = NULL;
    TP_CHECK_OK(tp_rpc_sync(a, "bravo", "tp.noop", NULL, WAIT_MS, NULL, &err),
                err);
    tp_args *in = args_n(100, 0);
    TP_CHECK_OK(tp_rpc_sync(a, "bravo", "tp.echo", in, WAIT_MS, NULL, &err),
                err);
    tp_args_unref(in);
    in = args_n(100, 1000);
    TP_CHECK_OK(tp_rpc_sync(a, "bravo", "tp.echo", in, WAIT_MS, NULL, &err),
                err);
    tp_args_unref(in);
    check_three(a, "REQUEST", "bravo", 1);
    tp_job_latch_post(&g_calls_done);
    TP_CHECK_EQ(tp_job_latch_wait(&g_checked, 1, WAIT_MS), 1);

    // Stop bravo: calls to it wait for a reply that cannot come.
    tp_args *out = NULL;
    TP_CHECK_OK(tp_rpc_sync(a, "bravo", "t.pid", NULL, WAIT_MS, &out, &err),
                err);
    size_t len = 0;
    const void *p = tp_args_bytes(out, &len);
    TP_CHECK_EQ(len, sizeof(int));
    int pid;
    memcpy(&pid, p, sizeof(pid));
    tp_args_unref(out);
    TP_CHECK_EQ(kill(pid, SIGSTOP), 0);

    in = args_n(10, 0);
    tp_future *slow =
        tp_rpc_async(a, "bravo", "tp.echo", in, tp_test_ms(4 * WAIT_MS));
    tp_future *f = tp_rpc_async(a, "bravo", "tp.noop", NULL, tp_test_ms(1500));
    tp_args_unref(in);
    tp_rpc_op_record ops[NOPS];
    size_t n = 0;
    TP_CHECK_EQ(tp_rpc_get_recent_ops(a, ops, NOPS, &n), TP_OK);
    const tp_rpc_op_record *o = find_op(ops, n, "REQUEST", "tp.echo", 10);
    TP_CHECK(o != NULL);
    uint64_t slow_id = o != NULL ? o->call_id : 0;
    o = find_op(ops, n, "REQUEST", "tp.noop", 0);
    TP_CHECK(o != NULL);
    uint64_t f_id = o != NULL ? o->call_id : 0;
    TP_CHECK(wait_state(a, slow_id, "REQUEST", TP_RPC_OP_WAITING, 1000));
    char *di = tp_rpc_get_debug_info(a);
    printf("%s", di);
    TP_CHECK_STR_CONTAINS(di, "REQUEST \"tp.echo\"");
    TP_CHECK_STR_CONTAINS(di, "to bravo (rank 1), 10 bytes, waiting reply");
    free(di);

    tp_status st = tp_rpc_wait(f, tp_test_ms(WAIT_MS), NULL, &err);
    TP_CHECK_EQ(st, TP_ETIMEDOUT);
    tp_error_unref(err);
    err = NULL;
    tp_future_unref(f);
    TP_CHECK(wait_state(a, f_id, "REQUEST", TP_RPC_OP_TIMED_OUT, 100));
    TP_CHECK(wait_state(a, slow_id, "REQUEST", TP_RPC_OP_WAITING, 100));
    pthread_mutex_lock(&g_log_mtx);
    printf("timeout line: %s\n", g_timeout_line);
    TP_CHECK_EQ(g_timeout_lines, 1);
    TP_CHECK_STR_CONTAINS(g_timeout_line, "call \"tp.noop\"");
    TP_CHECK_STR_CONTAINS(g_timeout_line, "to bravo (rank 1) timed out");
    TP_CHECK_STR_CONTAINS(g_timeout_line, "in flight to bravo: REQUEST "
                                          "\"tp.echo\"");
    TP_CHECK_STR_CONTAINS(g_timeout_line, "10 bytes, waiting reply for");
    pthread_mutex_unlock(&g_log_mtx);

    // The slow call fails at the shutdown; its record says failed.
    tp_rpc_shutdown(a, false, NULL);
    TP_CHECK_EQ(tp_rpc_wait(slow, WAIT_MS, NULL, &err), TP_ECLOSED);
    tp_error_unref(err);
    tp_future_unref(slow);
}

static void
test_ops_and_stopped_peer(void)
{
    tp_job j;
    tp_job_latch_init(&g_calls_done);
    tp_job_latch_init(&g_checked);
    tp_job_tcp(&j, 2, w_ops, NULL);
    j.names = k_names;
    j.setup = setup;
    j.kill_last[1] = true;
    j.expect_sig[1] = SIGKILL;
    tp_job_run(&j);
    tp_job_latch_fini(&g_calls_done);
    tp_job_latch_fini(&g_checked);
}

// ---- the ring's size

static void
w_ring(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_agent *a = tp_job_rpc_join("solo", rank, world, url, WAIT_MS, WAIT_MS);
    for (size_t i = 0; i < 5; i++) {
        tp_args *in = args_n(i, 0);
        tp_error *err = NULL;
        TP_CHECK_OK(tp_rpc_sync(a, "solo", "tp.echo", in, WAIT_MS, NULL, &err),
                    err);
        tp_args_unref(in);
    }
    tp_rpc_op_record ops[NOPS];
    size_t n = 99;
    TP_CHECK_EQ(tp_rpc_get_recent_ops(a, ops, NOPS, &n), TP_OK);
    TP_CHECK_EQ(n, 3u);
    for (size_t i = 0; i < n; i++) {
        TP_CHECK_EQ(ops[i].seq, 3 + i);
        TP_CHECK_EQ(ops[i].bytes, 2 + i); // oldest first
        TP_CHECK_EQ(ops[i].state, TP_RPC_OP_DONE);
        TP_CHECK_EQ(strcmp(ops[i].peer.name, "solo"), 0);
    }
    // A smaller buffer gets the newest.
    TP_CHECK_EQ(tp_rpc_get_recent_ops(a, ops, 2, &n), TP_OK);
    TP_CHECK_EQ(n, 2u);
    TP_CHECK_EQ(ops[0].seq, 4u);
    TP_CHECK_EQ(tp_rpc_get_recent_ops(a, NULL, 1, &n), TP_EINVAL);
    tp_job_rpc_leave(a, rank);
}

static void
w_off(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_agent *a = tp_job_rpc_join("solo", rank, world, url, WAIT_MS, WAIT_MS);
    tp_error *err = NULL;
    TP_CHECK_OK(tp_rpc_sync(a, "solo", "tp.noop", NULL, WAIT_MS, NULL, &err),
                err);
    tp_rpc_op_record ops[2];
    size_t n = 99;
    TP_CHECK_EQ(tp_rpc_get_recent_ops(a, ops, 2, &n), TP_OK);
    TP_CHECK_EQ(n, 0u);
    char *di = tp_rpc_get_debug_info(a);
    TP_CHECK_STR_CONTAINS(di, "flight recorder: off");
    free(di);
    tp_job_rpc_leave(a, rank);
}

static void
test_ring(void)
{
    // The variable sets the option's default.
    setenv("TP_RPC_FLIGHT_RECORDER", "5", 1);
    tp_agent_options o;
    tp_agent_options_init(&o);
    unsetenv("TP_RPC_FLIGHT_RECORDER");
    TP_CHECK_EQ(o.flight_recorder, 5);
    tp_agent_options_init(&o);
    TP_CHECK_EQ(o.flight_recorder, 64);

    tp_job j;
    tp_job_tcp(&j, 1, w_ring, NULL);
    j.env[0] = "TP_RPC_FLIGHT_RECORDER=3";
    tp_job_run(&j);
    tp_job_tcp(&j, 1, w_off, NULL);
    j.env[0] = "TP_RPC_FLIGHT_RECORDER=0";
    tp_job_run(&j);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE_T(test_ring, 60),
    TP_TEST_CASE_T(test_ops_and_stopped_peer, 90),
};

TP_TEST_MAIN(cases)
