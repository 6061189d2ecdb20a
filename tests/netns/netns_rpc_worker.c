// SPDX-License-Identifier: Apache-2.0
// netns_rpc_worker.c - one worker of the two-host RPC fault tests
// (netns_rpc_test.sh runs rank 0 and rank 1 in two network namespaces
// joined by a veth pair and breaks the link between them). Public API
// only. Rank 0 ("ns0") hosts the store and calls rank 1 ("ns1"); rank 1
// serves until rank 0 writes DIR/done.
//
//   netns_rpc_worker RANK STORE_URL SCENARIO DIR
//
// The script and the workers meet through files in DIR (the namespaces
// share the file system): rank 1's "ns.hold" handler creates
// DIR/entered.N when it starts; rank 0 creates DIR/ready when it wants
// the fault and waits for DIR/go (the fault is in place), then checks the
// outcome. Scenarios (rank 0's side):
//   loss       (5% of packets dropped both ways from the start) 300 calls
//              with bytes and a tensor: all succeed.
//   linkdown   4 calls held 2 s by ns1 are in flight when the link goes
//              down for 10 s: each succeeds, or fails naming ns1; none
//              hangs; after DIR/up new calls succeed.
//   blackhole  calls in flight and new calls while every packet is
//              dropped: all fail within the RPC timeout (or sooner, at the
//              TCP user timeout), naming ns1.
// Exit 0: the scenario held; 1: it did not (the reason on stderr).

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <tpipe/rpc.h>
#include <tpipe/tensor.h>

static const char *g_dir;
static atomic_int g_held;

static void
die(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "netns_rpc_worker: FAIL: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    exit(1);
}

static int64_t
now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void
sleep_ms(int64_t ms)
{
    struct timespec ts = {.tv_sec = (time_t)(ms / 1000),
                          .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static void
touch(const char *name)
{
    char p[512];
    snprintf(p, sizeof(p), "%s/%s", g_dir, name);
    int fd = open(p, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    if (fd < 0) {
        die("create %s: %s", p, strerror(errno));
    }
    close(fd);
}

// Waits until DIR/@name exists; dies after @ms.
static void
wait_file(const char *name, int64_t ms)
{
    char p[512];
    snprintf(p, sizeof(p), "%s/%s", g_dir, name);
    int64_t dl = now_ms() + ms;
    while (access(p, F_OK) != 0) {
        if (now_ms() > dl) {
            die("%s did not appear in %lld ms", p, (long long)ms);
        }
        sleep_ms(20);
    }
}

// "ns.hold": creates DIR/entered.N, sleeps the int64 ms given, and
// returns its input.
static tp_status
fn_hold(const tp_rpc_call_info *call, const tp_args *in, void *arg,
        tp_args **out_p, tp_error **err_p)
{
    size_t n = 0;
    const void *p = tp_args_bytes(in, &n);
    int64_t ms = 0;
    if (p == NULL || n != sizeof(ms)) {
        *err_p = tp_error_create(TP_EINVAL, NULL, "ns.hold wants an int64");
        return TP_EINVAL;
    }
    memcpy(&ms, p, sizeof(ms));
    char name[64];
    snprintf(name, sizeof(name), "entered.%d", atomic_fetch_add(&g_held, 1));
    touch(name);
    sleep_ms(ms);
    return tp_args_create(p, n, out_p);
}

static tp_args *
args_i64(int64_t v)
{
    tp_args *x = NULL;
    if (tp_args_create(&v, sizeof(v), &x) != TP_OK) {
        die("tp_args_create");
    }
    return x;
}

// One echo of @i as bytes plus a 64 KiB tensor; dies unless it comes back.
static void
echo_ok(tp_agent *a, int i, int64_t timeout_ms, const char *what)
{
    tp_args *in = args_i64(i);
    int64_t n = 16384;
    tp_tensor *t = NULL;
    tp_error *err = NULL;
    if (tp_tensor_full(TP_F32, 1, &n, (double)i, &t, &err) != TP_OK ||
        tp_args_add_tensor(in, t) != TP_OK) {
        die("tensor: %s", tp_error_message(err));
    }
    tp_tensor_unref(t);
    tp_args *out = NULL;
    int64_t t0 = now_ms();
    tp_status st = tp_rpc_sync(a, "ns1", "tp.echo", in, timeout_ms, &out, &err);
    if (st != TP_OK) {
        die("%s: call %d failed after %lld ms: %s: %s", what, i,
            (long long)(now_ms() - t0), tp_status_name(st),
            tp_error_message(err));
    }
    size_t nb = 0;
    const void *b = tp_args_bytes(out, &nb);
    int64_t v = -1;
    if (b != NULL && nb == sizeof(v)) {
        memcpy(&v, b, sizeof(v));
    }
    const float *d = tp_args_ntensors(out) == 1
                         ? tp_tensor_data(tp_args_tensor(out, 0))
                         : NULL;
    if (v != i || d == NULL || d[0] != (float)i || d[n - 1] != (float)i) {
        die("%s: call %d came back wrong", what, i);
    }
    tp_args_unref(out);
    tp_args_unref(in);
}

// The pipe to ns1 must be tcp: the namespaces are two hosts.
static void
check_tcp(tp_agent *a)
{
    tp_rpc_peer_stats ps;
    if (tp_rpc_get_peer_stats(a, 1, &ps) != TP_OK) {
        die("no stats for ns1");
    }
    if (strcmp(ps.transport, "tcp") != 0) {
        die("the pipe to ns1 uses transport \"%s\", want tcp", ps.transport);
    }
}

static void
scenario_loss(tp_agent *a)
{
    int64_t t0 = now_ms();
    for (int i = 0; i < 300; i++) {
        echo_ok(a, i, 20000, "5% loss");
    }
    printf("loss: 300 calls in %lld ms\n", (long long)(now_ms() - t0));
}

#define NHOLD 4

// True if every call in flight succeeded (false: the pipe failed, and the
// agent refuses a graceful shutdown with a worker whose pipe failed).
static bool
scenario_linkdown(tp_agent *a)
{
    tp_future *f[NHOLD];
    tp_args *in = args_i64(2000);
    for (int i = 0; i < NHOLD; i++) {
        f[i] = tp_rpc_async(a, "ns1", "ns.hold", in, 60000);
        if (f[i] == NULL) {
            die("tp_rpc_async");
        }
    }
    tp_args_unref(in);
    touch("ready"); // the script waits for DIR/entered.0..3 too
    wait_file("go", 30000);
    int64_t t0 = now_ms();
    int ok = 0;
    for (int i = 0; i < NHOLD; i++) {
        tp_error *err = NULL;
        // Bounded: link down 10 s, then TCP's retransmission backoff.
        tp_status st = tp_rpc_wait(f[i], 60000, NULL, &err);
        if (!tp_future_is_done(f[i])) {
            die("call %d still pending %lld ms after the link went down", i,
                (long long)(now_ms() - t0));
        } else if (st == TP_OK) {
            ok++;
        } else if (strstr(tp_error_message(err), "ns1") == NULL) {
            die("call %d failed without naming ns1: %s: %s", i,
                tp_status_name(st), tp_error_message(err));
        } else {
            printf("linkdown: call %d failed: %s: %s\n", i, tp_status_name(st),
                   tp_error_message(err));
        }
        tp_error_unref(err);
        tp_future_unref(f[i]);
    }
    printf("linkdown: %d of %d calls in flight succeeded, all ended %lld ms "
           "after the link went down\n",
           ok, NHOLD, (long long)(now_ms() - t0));
    wait_file("up", 30000);
    for (int i = 0; i < 20; i++) {
        echo_ok(a, i, 30000, "after link-up");
    }
    check_tcp(a);
    return ok == NHOLD;
}

static void
scenario_blackhole(tp_agent *a, int64_t rpc_timeout_ms)
{
    tp_future *f[NHOLD];
    tp_args *in = args_i64(1000);
    for (int i = 0; i < NHOLD; i++) {
        f[i] = tp_rpc_async(a, "ns1", "ns.hold", in, TP_TIMEOUT_DEFAULT);
        if (f[i] == NULL) {
            die("tp_rpc_async");
        }
    }
    tp_args_unref(in);
    touch("ready");
    wait_file("go", 30000);
    int64_t t0 = now_ms();
    // Calls made into the black hole.
    tp_future *g[NHOLD];
    for (int i = 0; i < NHOLD; i++) {
        tp_args *x = args_i64(i);
        g[i] = tp_rpc_async(a, "ns1", "tp.echo", x, TP_TIMEOUT_DEFAULT);
        tp_args_unref(x);
    }
    tp_future *all[2 * NHOLD];
    memcpy(all, f, sizeof(f));
    memcpy(all + NHOLD, g, sizeof(g));
    for (int i = 0; i < 2 * NHOLD; i++) {
        tp_error *err = NULL;
        tp_status st = tp_rpc_wait(all[i], rpc_timeout_ms + 10000, NULL, &err);
        int64_t dt = now_ms() - t0;
        if (!tp_future_is_done(all[i])) {
            die("call %d still pending %lld ms into the black hole (rpc "
                "timeout %lld ms)",
                i, (long long)dt, (long long)rpc_timeout_ms);
        }
        if (st == TP_OK) {
            die("call %d succeeded through the black hole", i);
        }
        if (strstr(tp_error_message(err), "ns1") == NULL) {
            die("call %d failed without naming ns1: %s: %s", i,
                tp_status_name(st), tp_error_message(err));
        }
        if (dt > rpc_timeout_ms + 3000) {
            die("call %d failed only after %lld ms (rpc timeout %lld ms)", i,
                (long long)dt, (long long)rpc_timeout_ms);
        }
        printf("blackhole: call %d failed after %lld ms: %s: %s\n", i,
               (long long)dt, tp_status_name(st), tp_error_message(err));
        tp_error_unref(err);
        tp_future_unref(all[i]);
    }
}

int
main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr,
                "usage: netns_rpc_worker RANK STORE_URL SCENARIO DIR\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    int rank = atoi(argv[1]);
    const char *url = argv[2], *scenario = argv[3];
    g_dir = argv[4];
    bool blackhole = strcmp(scenario, "blackhole") == 0;
    tp_error *err = NULL;
    if (tp_rpc_register("ns.hold", fn_hold, NULL, &err) != TP_OK) {
        die("register: %s", tp_error_message(err));
    }
    tp_agent_options o;
    tp_agent_options_init(&o);
    o.init_method = url;
    o.init_timeout_ms = 30000;
    o.shutdown_timeout_ms = 30000;
    o.rpc_timeout_ms = blackhole ? 5000 : 30000;
    o.num_worker_threads = 8;
    tp_agent *a = NULL;
    tp_status st =
        tp_rpc_init(rank == 0 ? "ns0" : "ns1", rank, 2, &o, &a, &err);
    if (st != TP_OK) {
        die("rank %d: init at %s: %s: %s", rank, url, tp_status_name(st),
            tp_error_message(err));
    }
    if (rank == 1) {
        wait_file("done", 120000);
        char p[512];
        snprintf(p, sizeof(p), "%s/abrupt", g_dir);
        bool graceful = !blackhole && access(p, F_OK) != 0;
        st = tp_rpc_shutdown(a, graceful, &err);
        if (st != TP_OK && graceful) {
            die("rank 1: shutdown: %s", tp_error_message(err));
        }
        tp_error_unref(err);
        return 0;
    }
    bool graceful = !blackhole;
    echo_ok(a, -1, 20000, "first call");
    if (!blackhole) {
        check_tcp(a);
    }
    if (strcmp(scenario, "loss") == 0) {
        scenario_loss(a);
    } else if (strcmp(scenario, "linkdown") == 0) {
        if (!scenario_linkdown(a)) {
            graceful = false;
            touch("abrupt");
        }
    } else if (blackhole) {
        check_tcp(a);
        scenario_blackhole(a, o.rpc_timeout_ms);
    } else {
        die("unknown scenario %s", scenario);
    }
    touch("done");
    int64_t t0 = now_ms();
    st = tp_rpc_shutdown(a, graceful, &err);
    if (st != TP_OK && graceful) {
        die("rank 0: graceful shutdown: %s", tp_error_message(err));
    }
    if (now_ms() - t0 > 15000) {
        die("rank 0: shutdown took %lld ms", (long long)(now_ms() - t0));
    }
    tp_error_unref(err);
    printf("%s: ok\n", scenario);
    return 0;
}
