// SPDX-License-Identifier: Apache-2.0
// store_api_test.c - issue 15 on the store: a malformed init method is
// reported before the ranks; rank and world size -1 come from the
// environment with tcp:// and file:// too; world size 0 and ranks out of
// range are refused at open on every backend; NULL handles; append,
// multi_set/multi_get, check and the prefix view on every backend (mem,
// file, tcp); a tcp store shared by two opens of one process. Loopback
// only; every wait has a deadline.

#include "tp_test.h"

#include <stdlib.h>
#include <unistd.h>

#include <tpipe/collectives.h>
#include <tpipe/rpc.h>
#include <tpipe/store.h>

#include "core/platform.h"
#include "store/store_int.h"

#define WAIT_MS 20000

typedef enum backend { B_MEM, B_FILE, B_TCP } backend;

typedef struct fixture {
    char f_url[512];
    char f_path[128];
    tp_store_server *f_srv;
} fixture;

static void
fix_init(fixture *f, backend b)
{
    memset(f, 0, sizeof(*f));
    tp_error *err = NULL;
    switch (b) {
    case B_MEM:
        snprintf(f->f_url, sizeof(f->f_url), "mem://api%d", (int)getpid());
        break;
    case B_FILE: {
        snprintf(f->f_path, sizeof(f->f_path), "/tmp/tp_store_api_XXXXXX");
        int fd = mkstemp(f->f_path);
        TP_CHECK(fd >= 0);
        close(fd);
        snprintf(f->f_url, sizeof(f->f_url), "file://%s", f->f_path);
        break;
    }
    case B_TCP:
        TP_CHECK_OK(tp_store_server_start("tcp://127.0.0.1:0", &f->f_srv, &err),
                    err);
        snprintf(f->f_url, sizeof(f->f_url), "%s?server=0",
                 tp_store_server_addr(f->f_srv));
        break;
    }
}

static void
fix_fini(fixture *f)
{
    tp_store_server_stop(f->f_srv);
    if (f->f_path[0] != '\0') {
        unlink(f->f_path);
    }
}

static void
clear_rank_env(void)
{
    const char *vars[] = {"RANK",
                          "WORLD_SIZE",
                          "LOCAL_RANK",
                          "SLURM_PROCID",
                          "SLURM_NTASKS",
                          "SLURM_LOCALID",
                          "OMPI_COMM_WORLD_RANK",
                          "OMPI_COMM_WORLD_SIZE",
                          "OMPI_COMM_WORLD_LOCAL_RANK",
                          "PMIX_RANK",
                          "PMI_RANK",
                          "PMI_SIZE"};
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        unsetenv(vars[i]);
    }
}

// ---- init methods and ranks ----

// Each malformed URL given with rank/world -1 (and no variables) is
// reported as malformed, by the store, RPC init and process-group init.
static void
test_bad_url_first(void)
{
    clear_rank_env();
    static const struct {
        const char *url, *want;
    } bad[] = {
        {"udp://x:1", "unknown init method"},
        {"tcp://127.0.0.1", "127.0.0.1"},
        {"tcp://127.0.0.1:99999", "99999"},
        {"tcp://127.0.0.1:5000?server=2", "unknown option"},
        {"file://rel/path", "absolute"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        tp_store *s = NULL;
        tp_error *err = NULL;
        TP_CHECK_EQ(tp_store_open(bad[i].url, -1, -1, 100, &s, &err),
                    TP_EINVAL);
        const char *m = tp_error_message(err);
        TP_CHECK_STR_CONTAINS(m, bad[i].want);
        TP_CHECKF(strstr(m, "rank -1") == NULL, "store %s: \"%s\"", bad[i].url,
                  m);
        tp_error_unref(err);
        err = NULL;

        tp_agent_options o;
        tp_agent_options_init(&o);
        o.init_method = bad[i].url;
        o.init_timeout_ms = 1000;
        tp_agent *a = NULL;
        TP_CHECK_EQ(tp_rpc_init("w", -1, -1, &o, &a, &err), TP_EINVAL);
        m = tp_error_message(err);
        TP_CHECK_STR_CONTAINS(m, bad[i].want);
        TP_CHECKF(strstr(m, "rank -1") == NULL, "rpc %s: \"%s\"", bad[i].url,
                  m);
        tp_error_unref(err);
        err = NULL;

        tp_pg *g = NULL;
        TP_CHECK_EQ(tp_pg_init(bad[i].url, -1, -1, NULL, &g, &err), TP_EINVAL);
        m = tp_error_message(err);
        TP_CHECK_STR_CONTAINS(m, bad[i].want);
        TP_CHECKF(strstr(m, "rank -1") == NULL, "pg %s: \"%s\"", bad[i].url, m);
        tp_error_unref(err);
    }
}

// -1 with tcp:// and file:// reads RANK/WORLD_SIZE, as env:// does; with
// none set it says which variables it looked for.
static void
test_ranks_from_env(void)
{
    clear_rank_env();
    char url[64];
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", tp_test_free_port());
    tp_store *s = NULL;
    tp_error *err = NULL;
    TP_CHECK_EQ(tp_store_open(url, -1, -1, 100, &s, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "WORLD_SIZE");
    tp_error_unref(err);
    err = NULL;

    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "1", 1);
    // Rank 0 from the environment: it hosts the tcp server.
    TP_CHECK_OK(tp_store_open(url, -1, -1, tp_test_ms(WAIT_MS), &s, &err), err);
    TP_CHECK_OK(tp_store_set(s, "k", "v", 1, -1, &err), err);
    tp_store_close(s);
    s = NULL;

    fixture f;
    fix_init(&f, B_FILE);
    TP_CHECK_OK(tp_store_open(f.f_url, -1, -1, tp_test_ms(WAIT_MS), &s, &err),
                err);
    tp_store_close(s);
    s = NULL;
    // Rank 3 of 2 from the environment: refused.
    setenv("RANK", "3", 1);
    setenv("WORLD_SIZE", "2", 1);
    TP_CHECK_EQ(tp_store_open(f.f_url, -1, -1, 100, &s, &err), TP_EINVAL);
    tp_error_unref(err);
    clear_rank_env();
    fix_fini(&f);
}

// World size 0 and ranks out of range are refused at open, on every
// backend, before anything is opened.
static void
test_world_refused(void)
{
    clear_rank_env();
    for (backend b = B_MEM; b <= B_TCP; b++) {
        fixture f;
        fix_init(&f, b);
        static const int rw[][2] = {{0, 0}, {2, 2}, {-2, 2}, {5, 3}, {0, -5}};
        for (size_t i = 0; i < sizeof(rw) / sizeof(rw[0]); i++) {
            tp_store *s = NULL;
            tp_error *err = NULL;
            tp_status st =
                tp_store_open(f.f_url, rw[i][0], rw[i][1], 100, &s, &err);
            TP_CHECKF(st == TP_EINVAL, "%s rank %d of %d: %s (%s)", f.f_url,
                      rw[i][0], rw[i][1], tp_status_name(st),
                      tp_error_message(err));
            TP_CHECK(s == NULL);
            TP_CHECK_STR_CONTAINS(tp_error_message(err), "world size");
            tp_error_unref(err);
        }
        fix_fini(&f);
    }
}

// ---- NULL handles ----

static void
check_einval(tp_status st, tp_error *err, const char *what)
{
    TP_CHECKF(st == TP_EINVAL, "%s: %s, want TP_EINVAL", what,
              tp_status_name(st));
    TP_CHECKF(err != NULL, "%s: no error message", what);
    tp_error_unref(err);
}

// Every call given a NULL store fails with TP_EINVAL (no crash); a wait
// with a huge count is refused before its array is read.
static void
test_null_handles(void)
{
    tp_status st;
    tp_error *err = NULL;
    void *v = NULL;
    size_t n = 0;
    int64_t i64 = 0;
    bool d = false;
    const char *key = "k";
    st = tp_store_set(NULL, "k", "v", 1, 10, &err);
    check_einval(st, err, "set");
    err = NULL;
    st = tp_store_get(NULL, "k", 10, &v, &n, &err);
    check_einval(st, err, "get");
    err = NULL;
    st = tp_store_add(NULL, "k", 1, 10, &i64, &err);
    check_einval(st, err, "add");
    err = NULL;
    st = tp_store_wait(NULL, &key, 1, 10, &err);
    check_einval(st, err, "wait");
    err = NULL;
    st = tp_store_compare_set(NULL, "k", "", 0, "x", 1, 10, &v, &n, &err);
    check_einval(st, err, "compare_set");
    err = NULL;
    st = tp_store_delete_key(NULL, "k", 10, &d, &err);
    check_einval(st, err, "delete");
    err = NULL;
    st = tp_store_num_keys(NULL, 10, &i64, &err);
    check_einval(st, err, "num_keys");
    err = NULL;
    TP_CHECK(tp_store_addr(NULL) != NULL);
    tp_store_close(NULL);

    tp_store *s = NULL;
    char url[64];
    snprintf(url, sizeof(url), "mem://null%d", (int)getpid());
    TP_CHECK_OK(tp_store_open(url, 0, 1, 1000, &s, &err), err);
    st = tp_store_get(s, "k", 10, NULL, &n, &err);
    check_einval(st, err, "get no val_p");
    err = NULL;
    st = tp_store_num_keys(s, 10, NULL, &err);
    check_einval(st, err, "num_keys no n_p");
    err = NULL;
    // One key in a heap block of one pointer, a count of billions: only
    // the count is looked at (ASan catches a read past the block).
    const char **keys = malloc(sizeof(*keys));
    TP_CHECK(keys != NULL);
    keys[0] = "k";
    TP_CHECK_EQ(tp_store_wait(s, keys, (size_t)1 << 40, 10, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "at most 4096");
    tp_error_unref(err);
    free(keys);
    tp_store_close(s);

    // RPC accessors given no agent.
    tp_worker_info wi;
    TP_CHECK_EQ(tp_rpc_world_size(NULL), TP_EINVAL);
    TP_CHECK_EQ(tp_rpc_get_worker_info(NULL, NULL, &wi), TP_EINVAL);
    TP_CHECK_EQ(tp_rpc_get_worker_info_by_rank(NULL, 0, &wi), TP_EINVAL);
    TP_CHECK_EQ(tp_rpc_get_worker_infos(NULL, &wi, 1), TP_EINVAL);
}

// ---- append, check, multi_set/multi_get, prefix views ----

static void
check_val(tp_store *s, const char *key, const char *want)
{
    void *v = NULL;
    size_t n = 0;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_store_get(s, key, tp_test_ms(WAIT_MS), &v, &n, &err), err);
    TP_CHECKF(n == strlen(want) && memcmp(v, want, n) == 0,
              "get %s: \"%s\", want \"%s\"", key, (char *)v, want);
    free(v);
}

static bool
all_set(tp_store *s, const char *const *keys, size_t n)
{
    bool all = false;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_store_check(s, keys, n, tp_test_ms(WAIT_MS), &all, &err),
                err);
    return all;
}

static void
new_ops(backend b)
{
    fixture f;
    fix_init(&f, b);
    tp_store *s = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_store_open(f.f_url, 0, 1, tp_test_ms(WAIT_MS), &s, &err),
                err);

    // append: a missing key starts empty.
    TP_CHECK_OK(tp_store_append(s, "log", "ab", 2, -1, &err), err);
    TP_CHECK_OK(tp_store_append(s, "log", "", 0, -1, &err), err);
    TP_CHECK_OK(tp_store_append(s, "log", "cde", 3, -1, &err), err);
    check_val(s, "log", "abcde");

    // check never waits.
    const char *k2[] = {"log", "nope"};
    uint64_t t0 = tp__now_ns();
    TP_CHECK(all_set(s, k2, 1));
    TP_CHECK(!all_set(s, k2, 2));
    TP_CHECK(tp__now_ns() - t0 < 2000u * 1000000u);
    bool all = true;
    TP_CHECK_EQ(tp_store_check(s, k2, 5000, -1, &all, &err), TP_EINVAL);
    tp_error_unref(err);
    err = NULL;

    // multi_set / multi_get.
    const char *mk[] = {"m1", "m2", "m3"};
    const void *mv[] = {"one", "", "three"};
    size_t ml[] = {3, 0, 5};
    TP_CHECK_OK(tp_store_multi_set(s, mk, mv, ml, 3, -1, &err), err);
    void *out[3] = {NULL, NULL, NULL};
    size_t ol[3] = {9, 9, 9};
    TP_CHECK_OK(tp_store_multi_get(s, mk, 3, -1, out, ol, &err), err);
    TP_CHECK(ol[0] == 3 && memcmp(out[0], "one", 3) == 0);
    TP_CHECK(ol[1] == 0);
    TP_CHECK(ol[2] == 5 && memcmp(out[2], "three", 5) == 0);
    for (int i = 0; i < 3; i++) {
        free(out[i]);
    }
    // A missing key times out and returns nothing.
    const char *mk2[] = {"m1", "missing"};
    void *out2[2] = {NULL, NULL};
    TP_CHECK_EQ(tp_store_multi_get(s, mk2, 2, 100, out2, NULL, &err),
                TP_ETIMEDOUT);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "timed out");
    TP_CHECK(out2[0] == NULL && out2[1] == NULL);
    tp_error_unref(err);
    err = NULL;

    // A prefix view: "p/" keys of the base; views nest.
    tp_store *p = NULL, *pq = NULL;
    TP_CHECK_OK(tp_store_prefix_open(s, "p", &p, &err), err);
    TP_CHECK_OK(tp_store_prefix_open(p, "q", &pq, &err), err);
    TP_CHECK_OK(tp_store_set(p, "k", "pv", 2, -1, &err), err);
    TP_CHECK_OK(tp_store_set(pq, "k", "pqv", 3, -1, &err), err);
    check_val(s, "p/k", "pv");
    check_val(s, "p/q/k", "pqv");
    check_val(p, "q/k", "pqv");
    int64_t nv = 0;
    TP_CHECK_OK(tp_store_add(pq, "cnt", 5, -1, &nv, &err), err);
    TP_CHECK_EQ(nv, 5);
    check_val(s, "p/q/cnt", "5");
    TP_CHECK_OK(tp_store_append(p, "k", "+", 1, -1, &err), err);
    check_val(s, "p/k", "pv+");
    const char *pk[] = {"k", "q/k"};
    TP_CHECK(all_set(p, pk, 2));
    TP_CHECK(!all_set(pq, pk, 2));
    TP_CHECK_OK(tp_store_wait(p, pk, 2, -1, &err), err);
    void *cv = NULL;
    size_t cl = 0;
    TP_CHECK_OK(
        tp_store_compare_set(p, "k", "pv+", 3, "new", 3, -1, &cv, &cl, &err),
        err);
    TP_CHECK(cl == 3 && memcmp(cv, "new", 3) == 0);
    free(cv);
    bool del = false;
    TP_CHECK_OK(tp_store_delete_key(p, "k", -1, &del, &err), err);
    TP_CHECK(del);
    TP_CHECK(!all_set(s, (const char *[]){"p/k"}, 1));
    // A key missing in the view times out naming the view's key.
    TP_CHECK_EQ(tp_store_get(pq, "gone", 100, &cv, &cl, &err), TP_ETIMEDOUT);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "\"gone\"");
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "prefix");
    tp_error_unref(err);
    err = NULL;
    // Too long once prefixed.
    char longk[TP_STORE_MAX_KEY + 1];
    memset(longk, 'x', TP_STORE_MAX_KEY);
    longk[TP_STORE_MAX_KEY] = '\0';
    TP_CHECK_EQ(tp_store_set(p, longk, "v", 1, -1, &err), TP_EINVAL);
    tp_error_unref(err);
    err = NULL;
    TP_CHECK_EQ(tp_store_prefix_open(s, "", &pq, &err), TP_EINVAL);
    tp_error_unref(err);
    err = NULL;
    tp_store_close(pq);
    tp_store_close(p);
    tp_store_close(s);
    fix_fini(&f);
}

static void
test_new_ops_mem(void)
{
    new_ops(B_MEM);
}

static void
test_new_ops_file(void)
{
    new_ops(B_FILE);
}

static void
test_new_ops_tcp(void)
{
    new_ops(B_TCP);
}

// ---- one tcp:// server for the opens of one process ----

// Two opens of one tcp://host:port as rank 0 in one process (RPC and a
// process group) share the server instead of failing with EADDRINUSE; it
// stops with the last close.
static void
test_tcp_shared(void)
{
    char url[64];
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", tp_test_free_port());
    tp_store *a = NULL, *b = NULL, *c = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_store_open(url, 0, 2, tp_test_ms(WAIT_MS), &a, &err), err);
    TP_CHECK_OK(tp_store_open(url, 0, 2, tp_test_ms(WAIT_MS), &b, &err), err);
    TP_CHECK_OK(tp_store_set(a, "k", "v", 1, -1, &err), err);
    check_val(b, "k", "v");
    // A rank 1 client of the same process is an ordinary client.
    TP_CHECK_OK(tp_store_open(url, 1, 2, tp_test_ms(WAIT_MS), &c, &err), err);
    check_val(c, "k", "v");
    tp_store_close(a);
    TP_CHECK_OK(tp_store_set(b, "k2", "w", 1, -1, &err), err);
    check_val(c, "k2", "w");
    tp_store_close(b);
    // The last host closed: the server is gone, the port free again.
    void *v = NULL;
    size_t n = 0;
    TP_CHECK(tp_store_get(c, "k", 2000, &v, &n, &err) != TP_OK);
    tp_error_unref(err);
    err = NULL;
    tp_store_close(c);
    TP_CHECK_OK(tp_store_open(url, 0, 1, tp_test_ms(WAIT_MS), &a, &err), err);
    int64_t nk = -1;
    TP_CHECK_OK(tp_store_num_keys(a, -1, &nk, &err), err);
    TP_CHECK_EQ(nk, 0);
    tp_store_close(a);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE(test_bad_url_first), TP_TEST_CASE(test_ranks_from_env),
    TP_TEST_CASE(test_world_refused), TP_TEST_CASE(test_null_handles),
    TP_TEST_CASE(test_new_ops_mem),   TP_TEST_CASE(test_new_ops_file),
    TP_TEST_CASE(test_new_ops_tcp),   TP_TEST_CASE(test_tcp_shared),
};

TP_TEST_MAIN(cases)
