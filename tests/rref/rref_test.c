// SPDX-License-Identifier: Apache-2.0
// rref_test.c - RRefs, remote() and remote objects (rref.h) across 2 to 4
// worker processes on loopback: creation and to_here (remote and local
// owners), errors of the owner's function, creation and to_here
// timeouts, fork chains A -> B -> C -> owner, RRefs as arguments and
// results, 10 000 RRefs created and released with every worker's counters
// back to zero, a deletion racing a fork in flight, the owner or a user
// killed, graceful shutdown with RRefs alive, proxies. Remote objects:
// rref_object_test.c; what both share: rref_util.c.
//
// Every worker is a forked child (tp_test_job.h); each registers the test
// functions and types, then calls tp_rpc_init. Every wait has a deadline.

#include "tp_test.h"

#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tpipe/rpc.h>
#include <tpipe/rref.h>

#include "rref_util.h"

// ---- cases ---------------------------------------------------------------

// remote() to another worker and to self, to_here, local values, RRef(v).
static void
w_basic(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_agent *a = join(rank, world, url);
    if (rank == 0) {
        tp_error *err = NULL;
        tp_rref *r = remote_ok(a, "bravo", "t.make", 7);
        TP_CHECK(!tp_rref_is_owner(r));
        TP_CHECK(strcmp(tp_rref_owner_name(r), "bravo") == 0);
        tp_worker_info wi;
        TP_CHECK_OK(tp_rref_owner(r, &wi), NULL);
        TP_CHECK_EQ(wi.rank, 1);
        // Created here: our rank in its id, and remote()'s own handle is
        // the fork with the same id.
        uint32_t cw = 9, fw = 9;
        uint64_t cn = 0, fn = 0;
        tp_rref_id(r, &cw, &cn, &fw, &fn);
        TP_CHECK_EQ(cw, 0);
        TP_CHECK(cn != 0);
        TP_CHECK(fw == cw && fn == cn);
        tp_args *v = here_ok(r);
        size_t n = 0;
        const void *b = tp_args_bytes(v, &n);
        TP_CHECK(n == 4 && memcmp(b, "made", 4) == 0);
        check_tensor(tp_args_tensor(v, 0), 7);
        tp_args_unref(v);
        TP_CHECK_OK(tp_rref_wait_created(r, WAIT_MS, &err), err);
        TP_CHECK(tp_rref_confirmed_by_owner(r));
        TP_CHECK(tp_rref_error(r) == NULL);
        // local_value is the owner's only, and says who owns it.
        tp_args *lv = NULL;
        TP_CHECK_EQ(tp_rref_local_value(r, WAIT_MS, &lv, &err), TP_EINVAL);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "owned by bravo (rank 1)");
        tp_error_unref(err);
        err = NULL;
        // Twice: a second fetch of the same value.
        v = here_ok(r);
        check_tensor(tp_args_tensor(v, 0), 7);
        tp_args_unref(v);
        tp_rref_unref(r);

        // Owned here: remote() to self.
        r = remote_ok(a, "alpha", "t.make", 3);
        TP_CHECK(tp_rref_is_owner(r));
        tp_rref_id(r, &cw, &cn, &fw, &fn);
        TP_CHECK(cw == 0 && cn != 0 && fw == 0 && fn == 0); // no fork
        TP_CHECK(tp_rref_confirmed_by_owner(r));
        v = here_ok(r);
        TP_CHECK_OK(tp_rref_local_value(r, WAIT_MS, &lv, &err), err);
        check_tensor(tp_args_tensor(lv, 0), 3);
        check_tensor(tp_args_tensor(v, 0), 3);
        TP_CHECK(tp_args_tensor(v, 0) != tp_args_tensor(lv, 0)); // a copy
        tp_args_unref(v);
        tp_rref_unref(r);

        // RRef(value), and its to_here_async.
        tp_args *val = args_i64(99);
        TP_CHECK_OK(tp_rref_create(a, val, &r, &err), err);
        tp_args_unref(val);
        tp_future *f = tp_rref_to_here_async(r, WAIT_MS);
        TP_CHECK_OK(tp_rpc_wait(f, tp_test_ms(WAIT_MS), &v, &err), err);
        TP_CHECK_EQ(get_i64(v), 99);
        tp_args_unref(v);
        tp_future_unref(f);
        tp_rref_unref(r);

        // to_here_async of a user RRef.
        r = remote_ok(a, "bravo", "t.make", 5);
        f = tp_rref_to_here_async(r, WAIT_MS);
        TP_CHECK_OK(tp_rpc_wait(f, tp_test_ms(WAIT_MS), &v, &err), err);
        check_tensor(tp_args_tensor(v, 0), 5);
        tp_args_unref(v);
        tp_future_unref(f);
        tp_rref_unref(r);

        char *info = tp_rpc_get_debug_info(a);
        TP_CHECK_STR_CONTAINS(info, "rrefs: owners");
        free(info);
        wait_settled(a, world, 0);
    }
    leave(a);
}

static void
test_basic(void)
{
    run(2, w_basic, NULL);
}

// An error of the owner's function, creation and to_here timeouts, and
// unknown functions.
static void
w_errors(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_agent *a = join(rank, world, url);
    if (rank == 0) {
        tp_error *err = NULL;
        tp_args *v = NULL;
        tp_rref *r = remote_ok(a, "bravo", "t.fail", 0);
        tp_status st = tp_rref_to_here(r, WAIT_MS, &v, &err);
        TP_CHECK_EQ(st, TP_EINVAL);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "bravo");
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "bad thing 42");
        tp_error_unref(err);
        err = NULL;
        TP_CHECK_EQ(tp_rref_wait_created(r, WAIT_MS, &err), TP_EINVAL);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "bad thing 42");
        tp_error_unref(err);
        err = NULL;
        TP_CHECK(tp_rref_error(r) != NULL);
        TP_CHECK_STR_CONTAINS(tp_error_message(tp_rref_error(r)), "bravo");
        tp_rref_unref(r);

        // Unknown function: named, with the worker.
        r = remote_ok(a, "bravo", "t.nope", 0);
        TP_CHECK_EQ(tp_rref_to_here(r, WAIT_MS, &v, &err), TP_ENOENT);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "t.nope");
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "bravo");
        tp_error_unref(err);
        err = NULL;
        tp_rref_unref(r);

        // to_here's own timeout: which RRef, which owner, how long.
        tp_args *in = args_i64(1500);
        TP_CHECK_OK(tp_remote(a, "bravo", "t.sleep", in, WAIT_MS, &r, &err),
                    err);
        int64_t t0 = tp_job_now_ms();
        st = tp_rref_to_here(r, 200, &v, &err);
        TP_CHECK_EQ(st, TP_ETIMEDOUT);
        TP_CHECK(tp_job_now_ms() - t0 < tp_test_ms(1400));
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "to_here of RRef");
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "owned by bravo (rank 1)");
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "200 ms");
        tp_error_unref(err);
        err = NULL;
        // ... and the value still comes once it exists.
        v = here_ok(r);
        TP_CHECK_EQ(get_i64(v), 1500);
        tp_args_unref(v);
        tp_rref_unref(r);

        // A creation that times out: to_here says so, at once.
        TP_CHECK_OK(tp_remote(a, "bravo", "t.sleep", in, 200, &r, &err), err);
        st = tp_rref_wait_created(r, WAIT_MS, &err);
        TP_CHECK_EQ(st, TP_ETIMEDOUT);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "timed out");
        tp_error_unref(err);
        err = NULL;
        t0 = tp_job_now_ms();
        TP_CHECK_EQ(tp_rref_to_here(r, WAIT_MS, &v, &err), TP_ETIMEDOUT);
        TP_CHECK(tp_job_now_ms() - t0 < tp_test_ms(500));
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "to_here of RRef");
        tp_error_unref(err);
        err = NULL;
        tp_args_unref(in);
        tp_rref_unref(r);
        // The late value on the owner goes too.
        wait_settled(a, world, 0);
    }
    leave(a);
}

static void
test_errors(void)
{
    run(2, w_errors, NULL);
}

// A fork chain alpha -> bravo -> charlie -> delta, delta owning the value:
// each to_here sees it, the owner gets its own RRef back.
static void
w_fork_chain(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_agent *a = join(rank, world, url);
    if (rank == 0) {
        tp_rref *r = remote_ok(a, "delta", "t.make", 11);
        // alpha -> bravo (keeps it in slot 0).
        tp_args *in = args_rref(r, 0);
        tp_error *err = NULL;
        TP_CHECK_OK(tp_rpc_sync(a, "bravo", "t.keep", in, WAIT_MS, NULL, &err),
                    err);
        tp_args_unref(in);
        // bravo -> charlie -> (t.here) and charlie -> delta, the owner.
        // "t.pass" on bravo passes its fork to charlie, whose "t.here"
        // fetches: 11 * 2 + 0 (not the owner).
        in = args_rref(r, 2);
        TP_CHECK_EQ(call_i64(a, 1, "t.pass", in), 22);
        tp_args_unref(in);
        // bravo passes to delta, the owner: it sees its own RRef.
        in = args_rref(r, 3);
        TP_CHECK_EQ(call_i64(a, 1, "t.pass", in), 23);
        tp_args_unref(in);
        // alpha -> charlie directly, while bravo still holds its fork.
        in = args_rref(r, 2);
        TP_CHECK_EQ(call_i64(a, 2, "t.here", in), 22);
        tp_args_unref(in);
        // And alpha's own still works.
        tp_args *v = here_ok(r);
        check_tensor(tp_args_tensor(v, 0), 11);
        tp_args_unref(v);
        // Let go everywhere: bravo's slot, then ours.
        tp_args *slot = args_i64(0);
        TP_CHECK_OK(
            tp_rpc_sync(a, "bravo", "t.drop", slot, WAIT_MS, NULL, &err), err);
        tp_args_unref(slot);
        tp_rref_unref(r);
        wait_settled(a, world, 0);
    }
    leave(a);
}

static void
test_fork_chain(void)
{
    run(4, w_fork_chain, NULL);
}

// An RRef as the result of a call (the owner's own, created there), as an
// argument to a third worker, inside a value (nested), and to self.
static void
w_arg_and_result(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_agent *a = join(rank, world, url);
    if (rank == 0) {
        tp_args *in = args_i64(4);
        tp_args *out = NULL;
        tp_error *err = NULL;
        TP_CHECK_OK(tp_rpc_sync(a, "bravo", "t.mkref", in, WAIT_MS, &out, &err),
                    err);
        tp_args_unref(in);
        TP_CHECK_EQ(tp_args_nrrefs(out), 1);
        tp_rref *r = tp_rref_ref(tp_args_rref(out, 0));
        tp_args_unref(out);
        TP_CHECK(!tp_rref_is_owner(r));
        TP_CHECK(strcmp(tp_rref_owner_name(r), "bravo") == 0);
        // From the owner itself: confirmed at once.
        TP_CHECK(tp_rref_confirmed_by_owner(r));
        tp_args *v = here_ok(r);
        check_tensor(tp_args_tensor(v, 0), 4);
        tp_args_unref(v);
        // As an argument to charlie, which fetches it.
        in = args_rref(r, 0);
        TP_CHECK_EQ(call_i64(a, 2, "t.here", in), 8);
        // ... and back from a call: tp.echo returns the same RRef.
        TP_CHECK_OK(
            tp_rpc_sync(a, "charlie", "tp.echo", in, WAIT_MS, &out, &err), err);
        TP_CHECK_EQ(tp_args_nrrefs(out), 1);
        v = here_ok(tp_args_rref(out, 0));
        check_tensor(tp_args_tensor(v, 0), 4);
        tp_args_unref(v);
        tp_args_unref(out);
        // An RRef inside a value: remote() of "t.mkref" keeps on bravo a
        // value holding bravo's own RRef; to_here forks that one to us.
        tp_rref *outer = remote_ok(a, "bravo", "t.mkref", 6);
        tp_args *ov = here_ok(outer);
        TP_CHECK_EQ(tp_args_nrrefs(ov), 1);
        tp_rref *inner = tp_args_rref(ov, 0);
        TP_CHECK(strcmp(tp_rref_owner_name(inner), "bravo") == 0);
        v = here_ok(inner);
        check_tensor(tp_args_tensor(v, 0), 6);
        tp_args_unref(v);
        tp_args_unref(ov);
        tp_rref_unref(outer);
        // To self: the same handle, no fork.
        TP_CHECK_OK(tp_rpc_sync(a, "alpha", "tp.echo", in, WAIT_MS, &out, &err),
                    err);
        TP_CHECK(tp_args_rref(out, 0) == r);
        tp_args_unref(out);
        tp_args_unref(in);
        tp_rref_unref(r);
        wait_settled(a, world, 0);
    }
    leave(a);
}

static void
test_arg_and_result(void)
{
    run(3, w_arg_and_result, NULL);
}

#define MANY     10000
#define INFLIGHT 256

// 10 000 RRefs created and released (some forked to a third worker),
// every counter back to zero on every worker.
static void
w_many(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_agent *a = join(rank, world, url);
    if (rank == 0) {
        tp_rref *win[INFLIGHT];
        int made = 0;
        while (made < MANY) {
            int n = MANY - made < INFLIGHT ? MANY - made : INFLIGHT;
            for (int i = 0; i < n; i++) {
                tp_error *err = NULL;
                TP_CHECK_OK(tp_remote_rank(a, 1 + (made + i) % 2, "tp.noop",
                                           NULL, WAIT_MS, &win[i], &err),
                            err);
            }
            // One of each window goes to charlie and back.
            tp_args *in = args_rref(win[0], 0);
            tp_args *out = NULL;
            tp_error *err = NULL;
            TP_CHECK_OK(
                tp_rpc_sync(a, "charlie", "tp.echo", in, WAIT_MS, &out, &err),
                err);
            tp_args_unref(out);
            tp_args_unref(in);
            for (int i = 0; i < n; i++) {
                tp_rref_unref(win[i]);
            }
            made += n;
        }
        int64_t v[8];
        stats_of(a, 1, v);
        TP_CHECKF(v[7] >= MANY / 2, "bravo created only %lld values",
                  (long long)v[7]);
        wait_settled(a, world, 0);
    }
    leave(a);
}

static void
test_many(void)
{
    run(3, w_many, NULL);
}

// A user lets go of its RRef while a fork of it is in flight: the owner
// keeps the value for the child.
static void
w_delete_races_fork(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_agent *a = join(rank, world, url);
    if (rank == 0) {
        for (int round = 0; round < 50; round++) {
            tp_rref *r = remote_ok(a, "bravo", "t.make", round);
            tp_args *in = args_rref(r, 0);
            tp_future *f = tp_rpc_async(a, "charlie", "t.here", in, WAIT_MS);
            tp_args_unref(in);
            tp_rref_unref(r); // before charlie even has it
            tp_args *out = NULL;
            tp_error *err = NULL;
            TP_CHECK_OK(tp_rpc_wait(f, tp_test_ms(WAIT_MS), &out, &err), err);
            TP_CHECK_EQ(get_i64(out), round * 2);
            tp_args_unref(out);
            tp_future_unref(f);
        }
        wait_settled(a, world, 0);
    }
    leave(a);
}

static void
test_delete_races_fork(void)
{
    run(3, w_delete_races_fork, NULL);
}

// The owner dies (SIGKILL) while a user waits in to_here: the wait fails
// within about a second naming it, and later calls fail at once.
static void
w_owner_killed(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_agent *a = join(rank, world, url);
    if (rank == 1) {
        // Dies by the SIGKILL below, in the middle of the job.
        for (;;) {
            tp_job_sleep_ms(1000);
        }
    }
    tp_args *in = args_i64(10000);
    tp_rref *slow = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_remote(a, "bravo", "t.sleep", in, WAIT_MS, &slow, &err),
                err);
    tp_args_unref(in);
    tp_rref *made = remote_ok(a, "bravo", "t.make", 1);
    tp_args *v = here_ok(made);
    tp_args_unref(v);
    pid_t victim = (pid_t)call_i64(a, 1, "t.pid", NULL);
    int64_t t0 = tp_job_now_ms();
    kill(victim, SIGKILL);
    tp_status st = tp_rref_to_here(slow, WAIT_MS, &v, &err);
    int64_t took = tp_job_now_ms() - t0;
    TP_CHECKF(st != TP_OK && TP_STATUS_IS_CONN(st), "to_here: %s",
              tp_status_name(st));
    TP_CHECKF(took < tp_test_ms(3000), "to_here failed after %lld ms",
              (long long)took);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "bravo");
    tp_error_unref(err);
    err = NULL;
    // Later: at once, naming the owner.
    t0 = tp_job_now_ms();
    st = tp_rref_to_here(made, WAIT_MS, &v, &err);
    TP_CHECK(st != TP_OK);
    TP_CHECK(tp_job_now_ms() - t0 < tp_test_ms(2000));
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "bravo");
    tp_error_unref(err);
    tp_rref_unref(slow);
    tp_rref_unref(made);
    TP_CHECK_OK(tp_rpc_shutdown(a, false, NULL), NULL);
}

static void
test_owner_killed(void)
{
    tp_job j;
    tp_job_tcp(&j, 2, w_owner_killed, NULL);
    j.setup = setup;
    j.names = k_names;
    j.expect_sig[1] = SIGKILL;
    tp_job_run(&j);
}

// A user dies holding forks: the owner drops them, and the value goes.
static void
w_user_killed(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_agent *a = join(rank, world, url);
    if (rank == 2) {
        for (;;) {
            tp_job_sleep_ms(1000);
        }
    }
    if (rank == 0) {
        tp_rref *r = remote_ok(a, "bravo", "t.make", 2);
        tp_args *in = args_rref(r, 0);
        tp_error *err = NULL;
        TP_CHECK_OK(
            tp_rpc_sync(a, "charlie", "t.keep", in, WAIT_MS, NULL, &err), err);
        tp_args_unref(in);
        tp_rref_unref(r);
        // bravo holds the value for charlie's fork.
        int64_t v[8];
        stats_of(a, 1, v);
        TP_CHECK_EQ(v[0], 1);
        kill((pid_t)call_i64(a, 2, "t.pid", NULL), SIGKILL);
        int64_t dl = tp_job_now_ms() + tp_test_ms(5000);
        do {
            tp_job_sleep_ms(10);
            stats_of(a, 1, v);
            TP_CHECKF(tp_job_now_ms() < dl,
                      "bravo still keeps %lld values for the dead charlie",
                      (long long)v[0]);
        } while (v[0] != 0 || v[2] != 0);
        TP_CHECK_OK(
            tp_rpc_sync(a, "bravo", "t.release", NULL, WAIT_MS, NULL, &err),
            err);
    } else {
        wait_release();
    }
    // The graceful agreement cannot include the dead worker.
    TP_CHECK_OK(tp_rpc_shutdown(a, false, NULL), NULL);
}

static void
test_user_killed(void)
{
    tp_job j;
    tp_job_tcp(&j, 3, w_user_killed, NULL);
    j.setup = setup;
    j.names = k_names;
    j.expect_sig[2] = SIGKILL;
    tp_job_run(&j);
}

// Graceful shutdown with RRefs alive: user RRefs the program still holds
// are deleted (their owners free the values); an owner RRef the program
// holds itself is reported, naming its creator.
static tp_rref *g_mine;

static void
w_shutdown_alive(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_agent *a = join(rank, world, url);
    tp_rref *held = NULL;
    if (rank == 0) {
        held = remote_ok(a, "bravo", "t.make", 1);
        tp_args *v = here_ok(held);
        tp_args_unref(v);
        tp_args *val = args_i64(5);
        TP_CHECK_OK(tp_rref_create(a, val, &g_mine, NULL), NULL);
        tp_args_unref(val);
        // charlie keeps a fork of bravo's value too.
        tp_args *in = args_rref(held, 1);
        TP_CHECK_OK(
            tp_rpc_sync(a, "charlie", "t.keep", in, WAIT_MS, NULL, NULL), NULL);
        tp_args_unref(in);
    }
    tp_error *err = NULL;
    tp_status st = tp_rpc_shutdown(a, true, &err);
    TP_CHECKF(st == TP_OK, "rank %d: shutdown: %s", rank,
              tp_error_message(err));
    if (rank == 0) {
        // Only our own RRef(5) is reported; bravo's value was freed.
        TP_CHECK_EQ(atomic_load(&g_leak_reports), 1);
        // The handles stay valid: the owner's value is still here.
        tp_args *lv = NULL;
        TP_CHECK_OK(tp_rref_local_value(g_mine, 1000, &lv, &err), err);
        TP_CHECK_EQ(get_i64(lv), 5);
        TP_CHECK(!tp_rref_is_owner(held));
        TP_CHECK_EQ(tp_rref_to_here(held, 1000, &lv, &err), TP_ECLOSED);
        tp_error_unref(err);
        tp_rref_unref(held);
        tp_rref_unref(g_mine);
    } else {
        TP_CHECK_EQ(atomic_load(&g_leak_reports), 0);
    }
    tp_rref_unref(atomic_exchange(&g_kept[1], NULL));
}

static void
test_shutdown_alive(void)
{
    run(3, w_shutdown_alive, NULL);
}

// Proxies: rref.rpc_sync(), rpc_async(), remote() run on the owner with
// the value as RRef 0.
static void
w_proxies(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_agent *a = join(rank, world, url);
    if (rank == 0) {
        tp_rref *r = remote_ok(a, "bravo", "t.make", 1);
        // sum of 1..16 = 136, plus the argument.
        tp_args *in = args_i64(1000);
        tp_args *out = NULL;
        tp_error *err = NULL;
        TP_CHECK_OK(tp_rref_rpc_sync(r, "t.sum", in, WAIT_MS, &out, &err), err);
        TP_CHECK_EQ(get_i64(out), 1136);
        tp_args_unref(out);
        tp_future *f = tp_rref_rpc_async(r, "t.sum", in, WAIT_MS);
        TP_CHECK_OK(tp_rpc_wait(f, tp_test_ms(WAIT_MS), &out, &err), err);
        TP_CHECK_EQ(get_i64(out), 1136);
        tp_args_unref(out);
        tp_future_unref(f);
        // remote(): the result stays on bravo.
        tp_rref *s = NULL;
        TP_CHECK_OK(tp_rref_remote(r, "t.sum", in, WAIT_MS, &s, &err), err);
        TP_CHECK(strcmp(tp_rref_owner_name(s), "bravo") == 0);
        out = here_ok(s);
        TP_CHECK_EQ(get_i64(out), 1136);
        tp_args_unref(out);
        tp_rref_unref(s);
        // In place on the owner: the value changes there.
        tp_args *three = args_i64(3);
        TP_CHECK_OK(tp_rref_rpc_sync(r, "t.scale", three, WAIT_MS, NULL, &err),
                    err);
        tp_args_unref(three);
        out = here_ok(r);
        const float *p = tp_tensor_data(tp_args_tensor(out, 0));
        TP_CHECK(p[0] == 3.0f && p[15] == 48.0f);
        tp_args_unref(out);
        // An owner RRef of our own, through the same calls.
        tp_rref *mine = remote_ok(a, "alpha", "t.make", 1);
        TP_CHECK_OK(tp_rref_rpc_sync(mine, "t.sum", in, WAIT_MS, &out, &err),
                    err);
        TP_CHECK_EQ(get_i64(out), 1136);
        tp_args_unref(out);
        TP_CHECK_OK(tp_rref_remote(mine, "t.sum", in, WAIT_MS, &s, &err), err);
        TP_CHECK(tp_rref_is_owner(s));
        out = here_ok(s);
        TP_CHECK_EQ(get_i64(out), 1136);
        tp_args_unref(out);
        tp_rref_unref(s);
        tp_rref_unref(mine);
        tp_args_unref(in);
        tp_rref_unref(r);
        wait_settled(a, world, 0);
    }
    leave(a);
}

static void
test_proxies(void)
{
    run(2, w_proxies, NULL);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE_T(test_basic, 60),
    TP_TEST_CASE_T(test_errors, 60),
    TP_TEST_CASE_T(test_fork_chain, 60),
    TP_TEST_CASE_T(test_arg_and_result, 60),
    TP_TEST_CASE_T(test_many, 120),
    TP_TEST_CASE_T(test_delete_races_fork, 60),
    TP_TEST_CASE_T(test_owner_killed, 60),
    TP_TEST_CASE_T(test_user_killed, 60),
    TP_TEST_CASE_T(test_shutdown_alive, 60),
    TP_TEST_CASE_T(test_proxies, 60),
};

TP_TEST_MAIN(cases)
