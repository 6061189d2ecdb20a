// SPDX-License-Identifier: Apache-2.0
// bench_rpc_run.c - `tpipe bench rpc`'s repetitions (bench_rpc.c has the
// options and the output): worker1 forked as a child, worker0 measuring
// in this process, a watchdog over both.

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tpipe/rpc.h>

#include "bench_common.h"
#include "bench_rpc.h"
#include "core/platform.h"
#include "tool.h"

// ---- watchdog --------------------------------------------------------------

// The agent bounds every call with the stall timeout; this alarm, a little
// later, ends the tool if the agent itself stops returning (a bug). The
// child dies with this process (PR_SET_PDEATHSIG).
static char br_alarm_msg[256];
static size_t br_alarm_len;
static unsigned br_alarm_s;

static void
br_alarm_handler(int sig)
{
    (void)sig;
    if (write(2, br_alarm_msg, br_alarm_len) < 0) {
        // Nothing more to do.
    }
    _exit(TOOL_EXIT_FAIL);
}

// Arms the watchdog for @what (a phase; the message is built now).
void
br_watch(const br_opts *o, const char *tr, const char *what)
{
    alarm(0); // a pending alarm must not see the message half rewritten
    br_alarm_s = (unsigned)ceil(o->bo_stall_s) + 10;
    int n = snprintf(br_alarm_msg, sizeof(br_alarm_msg),
                     "tpipe: bench rpc: %s: %s: the agent returned nothing "
                     "for %u s (its own deadline is %g s); exiting\n",
                     tr, what, br_alarm_s, o->bo_stall_s);
    br_alarm_len = n < 0 ? 0
                   : (size_t)n < sizeof(br_alarm_msg)
                       ? (size_t)n
                       : sizeof(br_alarm_msg) - 1;
    signal(SIGALRM, br_alarm_handler);
    alarm(br_alarm_s);
}

// Re-arms it for the same phase: progress was made.
void
br_watch_again(void)
{
    alarm(br_alarm_s);
}

// ---- helpers ---------------------------------------------------------------

void
br_error(char *buf, size_t len, tp_status st, tp_error *err, const char *fmt,
         ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, len, fmt, ap);
    va_end(ap);
    size_t off = n < 0 ? 0 : (size_t)n < len ? (size_t)n : len - 1;
    snprintf(buf + off, len - off, ": %s (%s)",
             err != NULL ? tp_error_message(err) : "no error message",
             tp_status_name(st));
    tp_error_unref(err);
}

void
br_agent_options(const br_opts *o, const br_transport *tr, const char *init,
                 int64_t shutdown_ms, tp_agent_options *ao)
{
    tp_agent_options_init(ao);
    ao->init_method = init;
    ao->transports = tr->bt_allow;
    ao->channels = o->bo_channel;
    ao->rpc_timeout_ms = (int64_t)(o->bo_stall_s * 1000);
    ao->init_timeout_ms = (int64_t)(o->bo_stall_s * 1000);
    ao->shutdown_timeout_ms = shutdown_ms;
}

// The threads of this process (0 if unknown). After a repetition's
// tp_rpc_shutdown none of the agent's should be left: a thread alive at
// the next fork could hold a lock the child then needs.
int
br_thread_count(void)
{
    DIR *d = opendir("/proc/self/task");
    int n = 0;
    if (d == NULL) {
        return 0;
    }
    for (struct dirent *e = readdir(d); e != NULL; e = readdir(d)) {
        n += e->d_name[0] != '.';
    }
    closedir(d);
    return n;
}

// ---- worker1: the child ----------------------------------------------------

// Joins as worker1, serves until worker0 shuts down, and reports one line
// on @fd: "ok INIT_US" or "error <what failed>". Never returns.
static void
br_child_main(const br_opts *o, const br_transport *tr, const char *init,
              int rank, int world, int fd)
{
    char name[16];
    snprintf(name, sizeof(name), "worker%d", rank);
    tp_agent_options ao;
    // The graceful shutdown waits for worker0's measurements: worker0
    // bounds them, and kills this process if they fail.
    br_agent_options(o, tr, init, INT64_C(24) * 3600 * 1000, &ao);
    tp_agent *a = NULL;
    tp_error *err = NULL;
    char line[1024];
    uint64_t t0 = tp__now_ns();
    tp_status st = tp_rpc_init(name, rank, world, &ao, &a, &err);
    double init_us = (double)(tp__now_ns() - t0) / 1e3;
    if (st != TP_OK) {
        br_error(line, sizeof(line), st, err, "tp_rpc_init");
        dprintf(fd, "error %s\n", line);
        _exit(TOOL_EXIT_FAIL);
    }
    st = tp_rpc_shutdown(a, true, &err);
    if (st != TP_OK) {
        br_error(line, sizeof(line), st, err, "tp_rpc_shutdown");
        dprintf(fd, "error %s\n", line);
        _exit(TOOL_EXIT_FAIL);
    }
    dprintf(fd, "ok %.1f\n", init_us);
    _exit(TOOL_EXIT_OK);
}

// ---- worker0: the measurements ---------------------------------------------

bool
br_lat_add(br_lat *l, double us)
{
    if (l->bl_n == l->bl_cap) {
        size_t cap = l->bl_cap ? 2 * l->bl_cap : 4096;
        double *nv = realloc(l->bl_v, cap * sizeof(double));
        if (nv == NULL) {
            return false;
        }
        l->bl_v = nv;
        l->bl_cap = cap;
    }
    l->bl_v[l->bl_n++] = us;
    return true;
}

void
br_lat_record(br_run *r, size_t cell, unsigned rep, br_lat *l, double size)
{
    qsort(l->bl_v, l->bl_n, sizeof(double), tool_cmp_double);
    double p50 = tool_median(l->bl_v, l->bl_n);
    *br_val(r, cell, BR_F_P50, rep) = p50;
    *br_val(r, cell, BR_F_P10, rep) = tool_quantile(l->bl_v, l->bl_n, 0.10);
    *br_val(r, cell, BR_F_P90, rep) = tool_quantile(l->bl_v, l->bl_n, 0.90);
    *br_val(r, cell, BR_F_MIN, rep) = l->bl_v[0];
    *br_val(r, cell, BR_F_MAX, rep) = l->bl_v[l->bl_n - 1];
    *br_val(r, cell, BR_F_GBPS, rep) = size > 0 ? 2 * size / p50 / 1e3 : NAN;
    *br_val(r, cell, BR_F_CALLS, rep) = (double)l->bl_n;
}

bool
br_measure_lat(br_run *r, tp_agent *a, unsigned rep, size_t cell,
               const br_op *op)
{
    const br_opts *o = r->rr_opts;
    br_lat l = {0};
    tp_error *err = NULL;
    tp_status st = TP_OK;
    void *keep = NULL;
    br_watch(o, r->rr_tr->bt_name, op->bo_test);
    // Warm-up: the first call may also set up the pipe.
    for (int i = 0; i < 100 && st == TP_OK; i++) {
        st = op->bo_run(a, op->bo_arg, &keep, &err);
        if (op->bo_drop != NULL) {
            op->bo_drop(keep);
        }
    }
    uint64_t start = tp__now_ns(), budget = (uint64_t)(o->bo_budget * 1e9);
    while (st == TP_OK &&
           (l.bl_n < BR_MIN_NOOP ||
            (l.bl_n < BR_MAX_NOOP && tp__now_ns() - start < budget))) {
        uint64_t t0 = tp__now_ns();
        st = op->bo_run(a, op->bo_arg, &keep, &err);
        uint64_t t1 = tp__now_ns();
        // What the operation leaves (an RRef to drop) goes untimed.
        if (op->bo_drop != NULL) {
            op->bo_drop(keep);
        }
        if (st == TP_OK && !br_lat_add(&l, (double)(t1 - t0) / 1e3)) {
            snprintf(r->rr_err, sizeof(r->rr_err), "%s: out of memory",
                     op->bo_test);
            free(l.bl_v);
            return false;
        }
        if ((l.bl_n & 1023) == 0) {
            br_watch_again();
        }
    }
    if (st != TP_OK) {
        br_error(r->rr_err, sizeof(r->rr_err), st, err, "%s: %s after %zu",
                 op->bo_test, op->bo_what, l.bl_n);
        free(l.bl_v);
        return false;
    }
    br_lat_record(r, cell, rep, &l, 0);
    tool_verbose(o->bo_verbose, "bench rpc", "%s: %s: %zu times, p50 %.2f us",
                 r->rr_tr->bt_name, op->bo_test, l.bl_n,
                 *br_val(r, cell, BR_F_P50, rep));
    free(l.bl_v);
    return true;
}

static tp_status
br_noop_once(tp_agent *a, void *arg, void **keep_p, tp_error **err_p)
{
    (void)arg;
    *keep_p = NULL;
    return tp_rpc_sync_rank(a, 1, "tp.noop", NULL, TP_TIMEOUT_DEFAULT, NULL,
                            err_p);
}

static bool
br_measure_noop(br_run *r, tp_agent *a, unsigned rep)
{
    static const br_op op = {.bo_test = "noop",
                             .bo_what = "rpc_sync(worker1, \"tp.noop\")",
                             .bo_run = br_noop_once};
    return br_measure_lat(r, a, rep, BR_C_NOOP, &op);
}

// Checks that @out is one float32 tensor equal to @t.
static bool
br_echo_check(br_run *r, const tp_args *out, const tp_tensor *t, uint64_t size)
{
    size_t nt = tp_args_ntensors(out);
    if (nt != 1) {
        snprintf(r->rr_err, sizeof(r->rr_err),
                 "echo %llu bytes: the result has %zu tensors, want 1",
                 (unsigned long long)size, nt);
        return false;
    }
    const tp_tensor *e = tp_args_tensor(out, 0);
    if (tp_tensor_dtype(e) != TP_F32 || tp_tensor_nbytes(e) != size ||
        !tp_tensor_is_contiguous(e)) {
        snprintf(r->rr_err, sizeof(r->rr_err),
                 "echo %llu bytes: the result is a %s tensor of %zu bytes%s",
                 (unsigned long long)size, tp_dtype_name(tp_tensor_dtype(e)),
                 tp_tensor_nbytes(e),
                 tp_tensor_is_contiguous(e) ? "" : ", not contiguous");
        return false;
    }
    const unsigned char *x = tp_tensor_data(t), *y = tp_tensor_data(e);
    for (uint64_t i = 0; i < size; i++) {
        if (x[i] != y[i]) {
            snprintf(r->rr_err, sizeof(r->rr_err),
                     "echo %llu bytes: the result differs at byte %llu "
                     "(0x%02x, sent 0x%02x)",
                     (unsigned long long)size, (unsigned long long)i, y[i],
                     x[i]);
            return false;
        }
    }
    return true;
}

static bool
br_measure_echo(br_run *r, tp_agent *a, unsigned rep, size_t si)
{
    const br_opts *o = r->rr_opts;
    uint64_t size = o->bo_sizes[si];
    char what[64], sz[32];
    tool_format_size(size, sz, sizeof(sz));
    snprintf(what, sizeof(what), "echo %s", sz);
    br_watch(o, r->rr_tr->bt_name, what);

    int64_t shape[1] = {(int64_t)(size / 4)};
    tp_tensor *t = NULL;
    tp_args *in = NULL, *out = NULL;
    tp_error *err = NULL;
    br_lat l = {0};
    bool ok = false;
    tp_status st = tp_tensor_empty(TP_F32, 1, shape, &t, &err);
    if (st != TP_OK) {
        br_error(r->rr_err, sizeof(r->rr_err), st, err, "%s: tp_tensor_empty",
                 what);
        return false;
    }
    float *d = tp_tensor_data(t);
    for (int64_t i = 0; i < shape[0]; i++) {
        d[i] = (float)(i % 4093) * 0.5f + (float)rep;
    }
    if ((st = tp_args_create(NULL, 0, &in)) != TP_OK ||
        (st = tp_args_add_tensor(in, t)) != TP_OK) {
        snprintf(r->rr_err, sizeof(r->rr_err), "%s: building the args: %s",
                 what, tp_status_name(st));
        goto out;
    }
    // The contents once (this call also warms up).
    st = tp_rpc_sync_rank(a, 1, "tp.echo", in, TP_TIMEOUT_DEFAULT, &out, &err);
    if (st != TP_OK) {
        br_error(r->rr_err, sizeof(r->rr_err), st, err,
                 "%s: rpc_sync(worker1, \"tp.echo\")", what);
        goto out;
    }
    if (!br_echo_check(r, out, t, size)) {
        goto out;
    }
    tp_args_unref(out);
    out = NULL;
    int warm = size >= (16u << 20) ? 1 : 4;
    for (int i = 0; i < warm && st == TP_OK; i++) {
        br_watch_again();
        st = tp_rpc_sync_rank(a, 1, "tp.echo", in, TP_TIMEOUT_DEFAULT, NULL,
                              &err);
    }
    uint64_t start = tp__now_ns(), budget = (uint64_t)(o->bo_budget * 1e9);
    while (st == TP_OK &&
           (l.bl_n < BR_MIN_ECHO ||
            (l.bl_n < BR_MAX_NOOP && tp__now_ns() - start < budget))) {
        br_watch_again();
        uint64_t t0 = tp__now_ns();
        st = tp_rpc_sync_rank(a, 1, "tp.echo", in, TP_TIMEOUT_DEFAULT, &out,
                              &err);
        uint64_t t1 = tp__now_ns();
        if (st == TP_OK && tp_args_ntensors(out) != 1) {
            snprintf(r->rr_err, sizeof(r->rr_err),
                     "%s: a result has %zu tensors", what,
                     tp_args_ntensors(out));
            goto out;
        }
        tp_args_unref(out);
        out = NULL;
        if (st == TP_OK && !br_lat_add(&l, (double)(t1 - t0) / 1e3)) {
            snprintf(r->rr_err, sizeof(r->rr_err), "%s: out of memory", what);
            goto out;
        }
    }
    if (st != TP_OK) {
        br_error(r->rr_err, sizeof(r->rr_err), st, err,
                 "%s: rpc_sync(worker1, \"tp.echo\") after %zu calls", what,
                 l.bl_n);
        goto out;
    }
    br_lat_record(r, BR_C_ECHO + si, rep, &l, (double)size);
    tool_verbose(o->bo_verbose, "bench rpc",
                 "%s: %s: %zu calls, p50 %.1f us, %.3f GB/s both ways",
                 r->rr_tr->bt_name, what, l.bl_n,
                 *br_val(r, BR_C_ECHO + si, BR_F_P50, rep),
                 *br_val(r, BR_C_ECHO + si, BR_F_GBPS, rep));
    ok = true;
out:
    free(l.bl_v);
    tp_args_unref(out);
    tp_args_unref(in);
    tp_tensor_unref(t);
    return ok;
}

// Issues @n async noop calls and waits for them all. False after writing
// what failed to r->rr_err.
static bool
br_async_batch(br_run *r, tp_agent *a, tp_future **fs, unsigned n,
               uint64_t done)
{
    int64_t wait_ms = (int64_t)(r->rr_opts->bo_stall_s * 1000) + 1000;
    unsigned issued = 0;
    bool ok = true;
    for (; issued < n; issued++) {
        fs[issued] =
            tp_rpc_async_rank(a, 1, "tp.noop", NULL, TP_TIMEOUT_DEFAULT);
        if (fs[issued] == NULL) {
            snprintf(r->rr_err, sizeof(r->rr_err),
                     "async: rpc_async(worker1, \"tp.noop\") returned NULL "
                     "(out of memory) after %llu calls",
                     (unsigned long long)(done + issued));
            ok = false;
            break;
        }
    }
    // Every issued future is waited for, even after a failure, so that no
    // call is outstanding when the agent shuts down.
    for (unsigned i = 0; i < issued; i++) {
        tp_error *err = NULL;
        tp_status st = tp_rpc_wait(fs[i], wait_ms, NULL, &err);
        if (st != TP_OK && ok) {
            br_error(r->rr_err, sizeof(r->rr_err), st, err,
                     "async: call %llu of rpc_async(worker1, \"tp.noop\")",
                     (unsigned long long)(done + i));
            ok = false;
        } else {
            tp_error_unref(err);
        }
        tp_future_unref(fs[i]);
    }
    return ok;
}

static bool
br_measure_async(br_run *r, tp_agent *a, unsigned rep)
{
    const br_opts *o = r->rr_opts;
    unsigned n = o->bo_inflight;
    tp_future **fs = calloc(n, sizeof(*fs));
    if (fs == NULL) {
        snprintf(r->rr_err, sizeof(r->rr_err), "async: out of memory");
        return false;
    }
    br_watch(o, r->rr_tr->bt_name, "async");
    bool ok = true;
    for (int i = 0; i < 3 && ok; i++) {
        ok = br_async_batch(r, a, fs, n, 0);
    }
    uint64_t calls = 0, start = tp__now_ns(), now = start;
    uint64_t budget = (uint64_t)(o->bo_budget * 1e9);
    while (ok && (calls < BR_MIN_ASYNC || now - start < budget)) {
        br_watch_again();
        ok = br_async_batch(r, a, fs, n, calls);
        calls += n;
        now = tp__now_ns();
    }
    free(fs);
    if (!ok) {
        return false;
    }
    double cps = (double)calls / ((double)(now - start) / 1e9);
    *br_val(r, BR_C_ASYNC, BR_F_CPS, rep) = cps;
    *br_val(r, BR_C_ASYNC, BR_F_CALLS, rep) = (double)calls;
    tool_verbose(o->bo_verbose, "bench rpc",
                 "%s: async: %llu calls, %u in flight, %.0f calls/s",
                 r->rr_tr->bt_name, (unsigned long long)calls, n, cps);
    return true;
}

// Checks which transport and channel the pipe to worker1 uses.
bool
br_check_pipe(br_run *r, tp_agent *a)
{
    tp_rpc_peer_stats ps;
    memset(&ps, 0, sizeof(ps));
    tp_status st = tp_rpc_get_peer_stats(a, 1, &ps);
    if (st != TP_OK) {
        snprintf(r->rr_err, sizeof(r->rr_err),
                 "tp_rpc_get_peer_stats(rank 1): %s", tp_status_name(st));
        return false;
    }
    snprintf(r->rr_transport, sizeof(r->rr_transport), "%s", ps.transport);
    snprintf(r->rr_channel, sizeof(r->rr_channel), "%s", ps.channel);
    if (ps.transport[0] != '\0' &&
        strcmp(ps.transport, r->rr_tr->bt_name) != 0) {
        snprintf(r->rr_err, sizeof(r->rr_err),
                 "asked for transport %s (allow list \"%s\") but the pipe to "
                 "worker1 runs over %s",
                 r->rr_tr->bt_name, r->rr_tr->bt_allow, ps.transport);
        return false;
    }
    if (ps.transport[0] != '\0' && r->rr_opts->bo_channel != NULL &&
        strcmp(ps.channel, r->rr_opts->bo_channel) != 0) {
        snprintf(r->rr_err, sizeof(r->rr_err),
                 "asked for channel %s but the pipe to worker1 uses %s",
                 r->rr_opts->bo_channel, ps.channel);
        return false;
    }
    return true;
}

// The measurements of repetition @rep on worker0's agent @a: the 2-worker
// tests, or rref_fork (@fork_pass). False after writing what failed to
// r->rr_err.
bool
br_measure_all(br_run *r, tp_agent *a, unsigned rep, bool fork_pass)
{
    const br_opts *o = r->rr_opts;
    bool ok = true;
    // remote right after noop: the two are compared (remote + to_here
    // against the round trip), so they run under the same conditions.
    if (ok && o->bo_noop && !fork_pass) {
        ok = br_measure_noop(r, a, rep);
    }
    if (ok && o->bo_remote && !fork_pass) {
        ok = br_measure_remote(r, a, rep);
    }
    // Before the 64 MiB echo and the async bursts, like the other latency
    // tests.
    if (ok && o->bo_autograd && !fork_pass) {
        ok = br_measure_autograd(r, a, rep);
    }
    for (size_t i = 0; ok && o->bo_echo && !fork_pass && i < o->bo_nsizes;
         i++) {
        ok = br_measure_echo(r, a, rep, i);
    }
    if (ok && o->bo_async && !fork_pass) {
        ok = br_measure_async(r, a, rep);
    }
    if (ok && fork_pass) {
        ok = br_measure_fork(r, a, rep);
    }
    return ok;
}

// Rank 0's part of repetition @rep, once the child runs. False after
// writing what failed to r->rr_err.
static bool
br_rank0(br_run *r, unsigned rep, const char *init, bool last)
{
    const br_opts *o = r->rr_opts;
    const char *tr = r->rr_tr->bt_name;
    tp_agent_options ao;
    br_agent_options(o, r->rr_tr, init, (int64_t)(o->bo_stall_s * 1000), &ao);
    tp_agent *a = NULL;
    tp_error *err = NULL;
    br_watch(o, tr, "tp_rpc_init");
    uint64_t t0 = tp__now_ns();
    tp_status st = tp_rpc_init("worker0", 0, br_world(r), &ao, &a, &err);
    double init_us = (double)(tp__now_ns() - t0) / 1e3;
    if (st != TP_OK) {
        br_error(r->rr_err, sizeof(r->rr_err), st, err,
                 "tp_rpc_init(worker0, rank 0 of %d, %s)", br_world(r), init);
        alarm(0);
        return false;
    }
    bool fork_pass = r->rr_fork_pass;
    if (!fork_pass) {
        *br_val(r, BR_C_INIT, BR_F_P50, rep) = init_us;
    }
    tool_verbose(o->bo_verbose, "bench rpc", "%s: repetition %u: init %.0f us",
                 tr, rep + 1, init_us);
    bool ok = br_measure_all(r, a, rep, fork_pass);
    if (ok) {
        ok = br_check_pipe(r, a);
    }
    if (o->bo_verbose && (last || !ok)) {
        char *info = tp_rpc_get_debug_info(a);
        fprintf(stderr, "tpipe: bench rpc: %s: worker0's debug info:\n%s%s", tr,
                info != NULL ? info : "(out of memory)\n",
                info != NULL && info[0] != '\0' &&
                        info[strlen(info) - 1] != '\n'
                    ? "\n"
                    : "");
        free(info);
    }
    // After a failure worker1 is killed: no graceful shutdown to wait for.
    br_watch(o, tr, "tp_rpc_shutdown");
    st = tp_rpc_shutdown(a, ok, &err);
    if (ok && st != TP_OK) {
        br_error(r->rr_err, sizeof(r->rr_err), st, err,
                 "tp_rpc_shutdown(worker0, graceful)");
        ok = false;
    } else {
        tp_error_unref(err);
    }
    alarm(0);
    return ok;
}

// One repetition: a fresh pair of processes. False after writing what
// failed to r->rr_err.
bool
br_run_rep(br_run *r, unsigned rep)
{
    const br_opts *o = r->rr_opts;
    char init[64], why[512] = "";
    int port = tool_free_port(r->rr_err, sizeof(r->rr_err));
    if (port < 0) {
        return false;
    }
    snprintf(init, sizeof(init), "tcp://127.0.0.1:%d", port);
    // Threads started at load time (OpenBLAS's pool) are expected; any
    // other one is the previous repetition's agent's.
    int nthreads = br_thread_count();
    if (rep > 0 && nthreads > r->rr_base_threads) {
        fprintf(stderr,
                "tpipe: bench rpc: warning: %d threads run before forking "
                "repetition %u, %d before the first (tp_rpc_shutdown left "
                "some)\n",
                nthreads, rep + 1, r->rr_base_threads);
    }
    int world = br_world(r);
    int fds[3] = {-1, -1, -1};
    pid_t pids[3] = {0, 0, 0};
    for (int k = 1; k < world; k++) {
        pids[k] = bench_fork_server(&fds[k], r->rr_err, sizeof(r->rr_err));
        if (pids[k] < 0) {
            for (int j = 1; j < k; j++) {
                close(fds[j]);
                bench_reap_server(pids[j], false, why, sizeof(why));
            }
            return false;
        }
        if (pids[k] == 0) {
            br_child_main(o, r->rr_tr, init, k, world, fds[k]);
        }
    }
    bool ok = br_rank0(r, rep, init, rep + 1 == o->bo_reps);
    // Each worker's line: at once after a failure (it may say why), else
    // after its shutdown, which follows ours.
    double child_us = NAN;
    for (int k = 1; k < world; k++) {
        char line[1024] = "";
        uint64_t wait_ns =
            ok ? (uint64_t)(o->bo_stall_s * 1e9) + 5000000000u : 2000000000u;
        tool_line_status ls =
            tool_read_line(fds[k], tp__now_ns() + wait_ns, line, sizeof(line),
                           why, sizeof(why));
        close(fds[k]);
        if (ls == TOOL_LINE_OK && strncmp(line, "ok ", 3) == 0) {
            double us = strtod(line + 3, NULL);
            child_us = isfinite(child_us) && child_us > us ? child_us : us;
        } else if (ls == TOOL_LINE_OK && strncmp(line, "error ", 6) == 0) {
            size_t off = strlen(r->rr_err);
            snprintf(r->rr_err + off, sizeof(r->rr_err) - off,
                     "%sworker%d: %.900s", ok ? "" : "; ", k, line + 6);
            ok = false;
        } else if (ok) {
            snprintf(r->rr_err, sizeof(r->rr_err), "worker%d (pid %d): %s", k,
                     (int)pids[k],
                     ls == TOOL_LINE_TIMEOUT ? "no report after its shutdown"
                     : ls == TOOL_LINE_EOF   ? "exited without a report"
                                             : why);
            ok = false;
        }
    }
    for (int k = 1; k < world; k++) {
        char reap[256] = "";
        if (!bench_reap_server(pids[k], ok, reap, sizeof(reap)) && ok) {
            snprintf(r->rr_err, sizeof(r->rr_err), "worker%d: %s", k, reap);
            ok = false;
        }
    }
    if (ok && !r->rr_fork_pass) {
        double p0 = *br_val(r, BR_C_INIT, BR_F_P50, rep);
        *br_val(r, BR_C_INIT, BR_F_RANKS_MAX, rep) =
            isfinite(child_us) && child_us > p0 ? child_us : p0;
    }
    return ok;
}
