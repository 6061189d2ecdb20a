// SPDX-License-Identifier: Apache-2.0
// rpc_init_test.c - the RPC agent (rpc.h), one process: args, options,
// function registration, bad names, ranks and init methods, a world of
// one; across processes: init through tcp://, env:// and file:// with 2, 3
// and 4 workers, worker infos, a duplicate name and an init that never
// completes. The workers and their test functions: rpc_common.h.

#include "rpc_common.h"

#include <string.h>
#include <unistd.h>

// ---- cases: args, options, registration, names (one process) ---------------

static void
test_args(void)
{
    tp_args *x = NULL;
    TP_CHECK_OK(tp_args_create(NULL, 0, &x), NULL);
    size_t n = 99;
    (void)tp_args_bytes(x, &n);
    TP_CHECK_EQ(n, 0);
    TP_CHECK_EQ(tp_args_ntensors(x), 0);
    tp_args_unref(x);
    x = NULL;
    TP_CHECK_EQ(tp_args_create(NULL, 5, &x), TP_EINVAL);
    TP_CHECK(x == NULL);

    char buf[8] = "abcdefg";
    TP_CHECK_OK(tp_args_create(buf, 7, &x), NULL);
    buf[0] = 'X'; // the args hold a copy
    const char *b = tp_args_bytes(x, &n);
    TP_CHECK_EQ(n, 7);
    TP_CHECK(memcmp(b, "abcdefg", 7) == 0);
    tp_tensor *t = u8_tensor(10, 1);
    TP_CHECK_OK(tp_args_add_tensor(x, t), NULL);
    TP_CHECK_EQ(tp_args_ntensors(x), 1);
    TP_CHECK(tp_args_tensor(x, 0) == t);
    TP_CHECK_EQ(tp_args_add_tensor(x, NULL), TP_EINVAL);
    TP_CHECK(tp_args_ref(x) == x);
    tp_args_unref(x);
    tp_args_unref(x);
    tp_tensor_unref(t); // still valid after the args took theirs
    tp_args_unref(NULL);

    // At most TP_RPC_MAX_TENSORS tensors.
    TP_CHECK_OK(tp_args_create(NULL, 0, &x), NULL);
    t = u8_tensor(1, 0);
    for (int i = 0; i < TP_RPC_MAX_TENSORS; i++) {
        TP_CHECK_OK(tp_args_add_tensor(x, t), NULL);
    }
    TP_CHECK_EQ(tp_args_add_tensor(x, t), TP_EINVAL);
    TP_CHECK_EQ(tp_args_ntensors(x), TP_RPC_MAX_TENSORS);
    tp_args_unref(x);
    tp_tensor_unref(t);
}

static void
test_options(void)
{
    unsetenv("TP_NUM_WORKER_THREADS");
    unsetenv("TP_RPC_TIMEOUT_MS");
    unsetenv("TP_INIT_METHOD");
    unsetenv("TP_RPC_INIT_TIMEOUT_MS");
    unsetenv("TP_RPC_SHUTDOWN_TIMEOUT_MS");
    tp_agent_options o;
    tp_agent_options_init(&o);
    TP_CHECK_EQ(o.num_worker_threads, 16);
    TP_CHECK_EQ(o.rpc_timeout_ms, 60000);
    TP_CHECK_EQ(o.init_timeout_ms, 60000);
    TP_CHECK_EQ(o.shutdown_timeout_ms, 60000);
    TP_CHECK(o.init_method != NULL && strcmp(o.init_method, "env://") == 0);
    setenv("TP_NUM_WORKER_THREADS", "3", 1);
    setenv("TP_RPC_TIMEOUT_MS", "250", 1);
    setenv("TP_INIT_METHOD", "file:///tmp/x", 1);
    setenv("TP_RPC_INIT_TIMEOUT_MS", "1234", 1);
    setenv("TP_RPC_SHUTDOWN_TIMEOUT_MS", "4321", 1);
    tp_agent_options_init(&o);
    TP_CHECK_EQ(o.num_worker_threads, 3);
    TP_CHECK_EQ(o.rpc_timeout_ms, 250);
    TP_CHECK_EQ(o.init_timeout_ms, 1234);
    TP_CHECK_EQ(o.shutdown_timeout_ms, 4321);
    TP_CHECK(o.init_method != NULL &&
             strcmp(o.init_method, "file:///tmp/x") == 0);
}

static tp_status
fn_other(const tp_rpc_call_info *call, const tp_args *in, void *arg,
         tp_args **out_p, tp_error **err_p)
{
    return TP_OK;
}

static void
test_register(void)
{
    tp_error *err = NULL;
    char long_name[TP_RPC_MAX_FN_NAME + 2];
    memset(long_name, 'f', sizeof(long_name) - 1);
    long_name[sizeof(long_name) - 1] = '\0';
    const char *bad[] = {"", "a b", "x\ny", "caf\xc3\xa9", long_name};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        TP_CHECKF(tp_rpc_register(bad[i], fn_other, NULL, &err) == TP_EINVAL,
                  "function name \"%.20s\" accepted", bad[i]);
        tp_error_unref(err);
        err = NULL;
    }
    long_name[TP_RPC_MAX_FN_NAME] = '\0'; // 255 bytes: fine
    TP_CHECK_OK(tp_rpc_register(long_name, fn_other, NULL, &err), err);
    TP_CHECK_OK(tp_rpc_register("a-b_c.d:e/f", fn_other, NULL, &err), err);
    // The same function again: a no-op; another one: taken.
    TP_CHECK_OK(tp_rpc_register("a-b_c.d:e/f", fn_other, NULL, &err), err);
    TP_CHECK_EQ(tp_rpc_register("a-b_c.d:e/f", fn_fail, NULL, &err), TP_EINVAL);
    tp_error_unref(err);
    err = NULL;
    TP_CHECK_EQ(tp_rpc_register("a-b_c.d:e/f", fn_other, &err, &err),
                TP_EINVAL);
    tp_error_unref(err);
    err = NULL;
    // Builtins are taken.
    TP_CHECK_EQ(tp_rpc_register("tp.echo", fn_other, NULL, &err), TP_EINVAL);
    tp_error_unref(err);
    err = NULL;
    TP_CHECK_EQ(tp_rpc_register_async("a-b_c.d:e/f", fn_async, NULL, &err),
                TP_EINVAL);
    tp_error_unref(err);
}

// Bad names, ranks and init methods fail at once with TP_EINVAL.
// Public calls given a NULL agent or future fail with TP_EINVAL and a
// message instead of crashing.
static void
test_null_handles(void)
{
    tp_args *out = NULL;
    tp_error *err = NULL;
    TP_CHECK_EQ(tp_rpc_sync(NULL, "bravo", "tp.noop", NULL, 100, &out, &err),
                TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "NULL agent");
    TP_CHECK(out == NULL);
    tp_error_unref(err);
    err = NULL;
    TP_CHECK_EQ(tp_rpc_sync_rank(NULL, 1, "tp.noop", NULL, 100, &out, &err),
                TP_EINVAL);
    tp_error_unref(err);
    err = NULL;
    tp_future *f = tp_rpc_async(NULL, "bravo", "tp.noop", NULL, 100);
    TP_CHECK(f != NULL);
    TP_CHECK_EQ(tp_rpc_wait(f, 1000, &out, &err), TP_EINVAL);
    tp_error_unref(err);
    err = NULL;
    tp_future_unref(f);
    TP_CHECK_EQ(tp_rpc_wait(NULL, 1000, &out, &err), TP_EINVAL);
    tp_error_unref(err);
}

static void
test_bad_init(void)
{
    char url[64];
    tcp_url(url, sizeof(url));
    tp_agent_options o;
    opts_init(&o, url);
    o.init_timeout_ms = 3000;
    char n128[TP_RPC_MAX_NAME + 2];
    memset(n128, 'n', sizeof(n128) - 1);
    n128[sizeof(n128) - 1] = '\0';
    TP_CHECK_EQ(strlen(n128), 128);
    const char *bad[] = {"", n128, "a b", "x/y", "a.b", "caf\xc3\xa9", NULL};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        tp_agent *a = NULL;
        tp_error *err = NULL;
        int64_t t0 = now_ms();
        tp_status st = tp_rpc_init(bad[i], 0, 1, &o, &a, &err);
        TP_CHECKF(st == TP_EINVAL, "name \"%s\": %s (%s), want TP_EINVAL",
                  bad[i] ? bad[i] : "(null)", tp_status_name(st),
                  tp_error_message(err));
        TP_CHECK(a == NULL);
        TP_CHECKF(now_ms() - t0 < 2000, "name check took %lld ms",
                  (long long)(now_ms() - t0));
        tp_error_unref(err);
    }
    struct {
        int rank, world;
    } br[] = {{1, 1}, {0, 0}, {-1, 2}, {2, 2}, {-1, -1}};
    for (size_t i = 0; i < sizeof(br) / sizeof(br[0]); i++) {
        tp_agent *a = NULL;
        tp_error *err = NULL;
        tp_status st = tp_rpc_init("ok", br[i].rank, br[i].world, &o, &a, &err);
        TP_CHECKF(st == TP_EINVAL, "rank %d world %d: %s (%s), want TP_EINVAL",
                  br[i].rank, br[i].world, tp_status_name(st),
                  tp_error_message(err));
        tp_error_unref(err);
    }
    tp_agent_options bo = o;
    bo.init_method = "udp://127.0.0.1:1";
    tp_agent *a = NULL;
    tp_error *err = NULL;
    TP_CHECK_EQ(tp_rpc_init("ok", 0, 1, &bo, &a, &err), TP_EINVAL);
    tp_error_unref(err);
    err = NULL;
    bo = o;
    bo.num_worker_threads = 0;
    TP_CHECK_EQ(tp_rpc_init("ok", 0, 1, &bo, &a, &err), TP_EINVAL);
    tp_error_unref(err);
    err = NULL;
    bo = o;
    bo.transports = "carrier-pigeon";
    tp_status st = tp_rpc_init("ok", 0, 1, &bo, &a, &err);
    TP_CHECKF(st != TP_OK, "unknown transport accepted");
    tp_error_unref(err);
}

// A world of one with the longest name and every allowed character: the
// worker calls itself.
static void
test_world_of_one(void)
{
    char url[64];
    tcp_url(url, sizeof(url));
    tp_agent_options o;
    opts_init(&o, url);
    char name[TP_RPC_MAX_NAME + 1];
    memset(name, 'w', TP_RPC_MAX_NAME);
    name[TP_RPC_MAX_NAME] = '\0';
    memcpy(name, "a-B_9:z", 7);
    tp_agent *a = NULL;
    tp_error *err = NULL;
    g_rank = 0;
    register_fns();
    TP_CHECK_OK(tp_rpc_init(name, 0, 1, &o, &a, &err), err);
    TP_CHECK_EQ(tp_rpc_world_size(a), 1);
    tp_worker_info wi;
    TP_CHECK_OK(tp_rpc_get_worker_info(a, NULL, &wi), NULL);
    TP_CHECK(strcmp(wi.name, name) == 0);
    TP_CHECK_EQ(wi.rank, 0);
    tp_args *r = call_ok(a, name, "tp.noop", NULL, 5000);
    tp_args_unref(r);
    tp_args *in = args_str("me");
    r = call_rank_ok(a, 0, "tp.echo", in, 5000);
    check_str(r, "me");
    tp_args_unref(r);
    tp_args_unref(in);
    leave(a);
}

// ---- cases: init and worker infos -------------------------------------------

// Every worker checks the infos of all, then calls tp.noop on everyone
// (itself too) by name and by rank.
static void
worker_infos(int rank, int world, const char *url, void *arg)
{
    tp_agent *a = join(rank, world, url);
    // Right after init, every other worker already knows this one: its
    // handlers see this worker as the caller.
    for (int r = 0; r < world; r++) {
        char f[6][160];
        tp_args *res = call_rank_ok(a, r, "t.info", NULL, WAIT_MS);
        info_fields(res, f);
        TP_CHECKF(strcmp(f[1], k_names[rank]) == 0 && atoi(f[2]) == rank,
                  "rank %d: %s saw the caller as \"%s\" (rank %s)", rank,
                  k_names[r], f[1], f[2]);
        tp_args_unref(res);
    }
    TP_CHECK_EQ(tp_rpc_world_size(a), world);
    tp_worker_info wi;
    TP_CHECK_OK(tp_rpc_get_worker_info(a, NULL, &wi), NULL);
    TP_CHECK(strcmp(wi.name, k_names[rank]) == 0);
    TP_CHECK_EQ(wi.rank, rank);
    for (int r = 0; r < world; r++) {
        memset(&wi, 0, sizeof(wi));
        TP_CHECK_OK(tp_rpc_get_worker_info(a, k_names[r], &wi), NULL);
        TP_CHECK(strcmp(wi.name, k_names[r]) == 0);
        TP_CHECK_EQ(wi.rank, r);
        memset(&wi, 0, sizeof(wi));
        TP_CHECK_OK(tp_rpc_get_worker_info_by_rank(a, r, &wi), NULL);
        TP_CHECK(strcmp(wi.name, k_names[r]) == 0);
        TP_CHECK_EQ(wi.rank, r);
    }
    TP_CHECK_EQ(tp_rpc_get_worker_info(a, "zulu", &wi), TP_ENOENT);
    TP_CHECK_EQ(tp_rpc_get_worker_info_by_rank(a, world, &wi), TP_ENOENT);
    TP_CHECK_EQ(tp_rpc_get_worker_info_by_rank(a, -1, &wi), TP_ENOENT);
    tp_worker_info all[MAX_WORLD + 1];
    memset(all, 0, sizeof(all));
    TP_CHECK_EQ(tp_rpc_get_worker_infos(a, all, MAX_WORLD + 1), world);
    for (int r = 0; r < world; r++) {
        TP_CHECK(strcmp(all[r].name, k_names[r]) == 0);
        TP_CHECK_EQ(all[r].rank, r);
    }
    memset(all, 0, sizeof(all));
    TP_CHECK_EQ(tp_rpc_get_worker_infos(a, all, 1), world);
    TP_CHECK(strcmp(all[0].name, k_names[0]) == 0);
    TP_CHECK(all[1].name[0] == '\0'); // only @n written
    for (int r = 0; r < world; r++) {
        tp_args_unref(call_ok(a, k_names[r], "tp.noop", NULL, WAIT_MS));
        tp_args_unref(call_rank_ok(a, r, "tp.noop", NULL, WAIT_MS));
    }
    leave(a);
}

static void
test_init_tcp_4(void)
{
    run_tcp(4, worker_infos, NULL);
}

static void
test_init_tcp_2(void)
{
    run_tcp(2, worker_infos, NULL);
}

static void
test_init_file_3(void)
{
    char path[] = "/tmp/tp_rpc_init_XXXXXX";
    int fd = mkstemp(path);
    TP_CHECK(fd >= 0);
    close(fd);
    // file:// says nothing about the network: keep the pipes on loopback.
    setenv("TP_SOCKET_IFNAME", "lo", 1);
    job j;
    job_tcp(&j, 3, worker_infos, NULL);
    snprintf(j.url, sizeof(j.url), "file://%s", path);
    job_run(&j);
    unlink(path);
}

static void
worker_env(int rank, int world, const char *url, void *arg)
{
    const char *clear[] = {"SLURM_PROCID",         "SLURM_NTASKS",
                           "SLURM_LOCALID",        "OMPI_COMM_WORLD_RANK",
                           "OMPI_COMM_WORLD_SIZE", "LOCAL_RANK"};
    for (size_t i = 0; i < sizeof(clear) / sizeof(clear[0]); i++) {
        unsetenv(clear[i]);
    }
    char v[16];
    snprintf(v, sizeof(v), "%d", rank);
    setenv("RANK", v, 1);
    snprintf(v, sizeof(v), "%d", world);
    setenv("WORLD_SIZE", v, 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", url, 1); // the port only (see test_init_env_2)
    tp_agent_options o;
    opts_init(&o, "env://");
    tp_agent *a = NULL;
    tp_error *err = NULL;
    tp_status st = tp_rpc_init(k_names[rank], -1, -1, &o, &a, &err);
    TP_CHECKF(st == TP_OK, "rank %d: env:// init: %s: %s", rank,
              tp_status_name(st), tp_error_message(err));
    tp_worker_info wi;
    TP_CHECK_OK(tp_rpc_get_worker_info(a, NULL, &wi), NULL);
    TP_CHECK_EQ(wi.rank, rank);
    TP_CHECK_EQ(tp_rpc_world_size(a), world);
    char msg[32];
    snprintf(msg, sizeof(msg), "from %d", rank);
    tp_args *in = args_str(msg);
    tp_args *r = call_ok(a, k_names[1 - rank], "tp.echo", in, WAIT_MS);
    check_str(r, msg);
    tp_args_unref(r);
    tp_args_unref(in);
    leave(a);
}

static void
test_init_env_2(void)
{
    job j;
    job_tcp(&j, 2, worker_env, NULL);
    snprintf(j.url, sizeof(j.url), "%d", tp_test_free_port());
    job_run(&j);
}

// Two ranks named "dup": init fails on every worker, naming both ranks.
static void
worker_dup(int rank, int world, const char *url, void *arg)
{
    tp_agent_options o;
    opts_init(&o, url);
    o.init_timeout_ms = tp_test_ms(15000);
    const char *name = rank == 0 ? "solo" : "dup";
    tp_agent *a = NULL;
    tp_error *err = NULL;
    int64_t t0 = now_ms();
    tp_status st = tp_rpc_init(name, rank, world, &o, &a, &err);
    int64_t dt = now_ms() - t0;
    TP_CHECKF(st == TP_EINVAL, "rank %d: init with a duplicate name: %s (%s)",
              rank, tp_status_name(st), tp_error_message(err));
    TP_CHECK(a == NULL);
    const char *m = tp_error_message(err);
    TP_CHECK_STR_CONTAINS(m, "dup");
    TP_CHECKF(has_number(m, 1) && has_number(m, 2),
              "rank %d: \"%s\" does not name ranks 1 and 2", rank, m);
    TP_CHECKF(dt < tp_test_ms(8000),
              "rank %d: the duplicate was found after %lld ms", rank,
              (long long)dt);
    tp_error_unref(err);
}

static void
test_init_duplicate_name(void)
{
    run_tcp(3, worker_dup, NULL);
}

// Rank 1 says the world has 3 workers, rank 0 says 2: both fail at once
// (not at the 15 s deadline), naming both sizes (store/join.h).
static void
worker_world_mismatch(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_agent_options o;
    opts_init(&o, url);
    o.init_timeout_ms = tp_test_ms(15000);
    tp_agent *a = NULL;
    tp_error *err = NULL;
    int64_t t0 = now_ms();
    tp_status st = tp_rpc_init(k_names[rank], rank, world + rank, &o, &a, &err);
    int64_t dt = now_ms() - t0;
    TP_CHECKF(st == TP_EINVAL, "rank %d: init with another world size: %s (%s)",
              rank, tp_status_name(st), tp_error_message(err));
    TP_CHECK(a == NULL);
    const char *m = tp_error_message(err);
    TP_CHECKF(has_number(m, 2) && has_number(m, 3) &&
                  strstr(m, "world size") != NULL,
              "rank %d: \"%s\" does not name both world sizes", rank, m);
    TP_CHECKF(dt < tp_test_ms(5000),
              "rank %d: the disagreement was found after %lld ms", rank,
              (long long)dt);
    tp_error_unref(err);
}

static void
test_init_world_mismatch(void)
{
    run_tcp(2, worker_world_mismatch, NULL);
}

// world 3, only ranks 0 and 1 start: both time out, naming rank 2. alpha
// hosts the store: it waits longer, so that bravo's init ends on its own
// deadline rather than on the store going away; alpha's ends then too
// (bravo's giving up is posted to the generation: store/join.h).
static void
worker_init_timeout(int rank, int world, const char *url, void *arg)
{
    int64_t limit = rank == 0 ? 3000 : 1500;
    tp_agent_options o;
    opts_init(&o, url);
    o.init_timeout_ms = limit;
    tp_agent *a = NULL;
    tp_error *err = NULL;
    int64_t t0 = now_ms();
    tp_status st = tp_rpc_init(k_names[rank], rank, world, &o, &a, &err);
    int64_t dt = now_ms() - t0;
    TP_CHECKF(st == TP_ETIMEDOUT, "rank %d: init without rank 2: %s (%s)", rank,
              tp_status_name(st), tp_error_message(err));
    TP_CHECK(a == NULL);
    const char *m = tp_error_message(err);
    TP_CHECKF(has_number(m, 2) && strstr(m, "rank") != NULL,
              "rank %d: \"%s\" does not name the missing rank 2", rank, m);
    TP_CHECKF(dt >= 1500 - 500 && dt < limit + tp_test_ms(4500),
              "rank %d: init gave up after %lld ms (timeout %lld)", rank,
              (long long)dt, (long long)limit);
    tp_error_unref(err);
}

static void
test_init_timeout(void)
{
    job j;
    job_tcp(&j, 3, worker_init_timeout, NULL);
    j.nstart = 2;
    job_run(&j);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE(test_args),
    TP_TEST_CASE(test_options),
    TP_TEST_CASE(test_register),
    TP_TEST_CASE(test_bad_init),
    TP_TEST_CASE(test_null_handles),
    TP_TEST_CASE(test_world_of_one),
    TP_TEST_CASE_T(test_init_tcp_2, 60),
    TP_TEST_CASE_T(test_init_tcp_4, 60),
    TP_TEST_CASE_T(test_init_file_3, 60),
    TP_TEST_CASE_T(test_init_env_2, 60),
    TP_TEST_CASE_T(test_init_duplicate_name, 60),
    TP_TEST_CASE_T(test_init_world_mismatch, 60),
    TP_TEST_CASE_T(test_init_timeout, 60),
};

TP_TEST_MAIN(cases)
