// SPDX-License-Identifier: Apache-2.0
// bench_rpc.c - `tpipe bench rpc`: the RPC agent (include/tpipe/rpc.h)
// between two worker processes on 127.0.0.1, measured the way
// ../shared/peers/torch_rpc_bench.py measures PyTorch's TensorPipe agent.
//
// Each repetition is a fresh pair of processes: a free loopback port is
// picked, then the worker1 child is forked before this process creates any
// thread or agent (fork with threads is unsafe). Both call tp_rpc_init with
// init_method tcp://127.0.0.1:PORT (rank 0, this process, hosts the store)
// and the --transport / --channel allow lists. Rank 0 measures; rank 1 only
// serves: it goes straight into a graceful tp_rpc_shutdown, which returns
// once rank 0 has finished and shut down too. The child then reports its
// init time (or what failed) in one line through a pipe(2) and exits.
//
// Tests:
//   noop   tp_rpc_sync of the builtin "tp.noop": round trip p50/p10/p90/min
//   echo   tp_rpc_sync of "tp.echo" with one float32 tensor of each size;
//          the returned contents are checked once; p50 and GB/s counting
//          both directions (2 * size / p50)
//   async  calls/s of tp_rpc_async("tp.noop") in batches of --inflight,
//          each batch waited for with tp_rpc_wait
//   init   rank 0's tp_rpc_init time (and the slower of the two ranks)
//   remote tp_remote(worker1, "tp.noop") + tp_rref_to_here: p50/p10/...
//   rref_fork  a user RRef (owned by worker1) passed to worker2 and back
//          (tp.echo): each pass forks it twice; the protocol's FORK and
//          CHILD_ACCEPT messages run in the background. It runs in a
//          pass of its own, with a third worker (init stays a 2-worker
//          init).
//   dist_autograd  one distributed autograd iteration (PyTorch's
//          dist_autograd_fwd_bwd): a context, rpc_sync(worker1,
//          "bench.mul") of two 1024-float leaves x and w (y = x * w there),
//          loss = sum(y), backward, get_gradients, release: p50/p10/...
//          "bench.mul" is registered before the workers are forked.
// Every repetition yields one value per statistic; the output is the
// median over repetitions. Every call has a deadline (--stall-timeout: the
// agent's rpc_timeout_ms, init_timeout_ms and rank 0's shutdown timeout),
// and a watchdog alarm ends the tool if the agent itself stops returning.

#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "bench_out.h"
#include "bench_rpc.h"
#include "core/platform.h"
#include "tool.h"

static const bench_usage br_usage = {
    .bu_head =
        "usage: tpipe bench rpc [options]\n"
        "\n"
        "The RPC agent between two worker processes on 127.0.0.1 (worker0 "
        "measures,\n"
        "worker1 serves), each repetition a fresh pair started with "
        "tp_rpc_init over\n"
        "init_method tcp://127.0.0.1:PORT.\n"
        "  noop   rpc_sync(\"tp.noop\") round trip, us (p50, p10, p90, min)\n"
        "  echo   rpc_sync(\"tp.echo\") of one float32 tensor per size; GB/s "
        "= 2*size/p50\n"
        "  async  rpc_async(\"tp.noop\") calls/s, --inflight calls per "
        "batch\n"
        "  init   tp_rpc_init of 2 workers, us (worker0; the slower rank "
        "too)\n"
        "  remote remote(worker1, \"tp.noop\") + to_here, us\n"
        "  rref_fork  rpc_sync(worker2, \"tp.echo\") of a user RRef owned by "
        "worker1\n"
        "         (forked there and back), us; starts a third worker\n"
        "  dist_autograd  one distributed autograd iteration, us: context, "
        "rpc_sync(\n"
        "         worker1, \"bench.mul\", x, w) of 1024-float leaves (y = x * "
        "w there),\n"
        "         loss = sum(y), backward, get_gradients (x and w), release\n",
    .bu_tail =
        "JSON line: {\"bench\":\"rpc\",\"transport\":\"shm\",\"channel\":"
        "\"cma\",\"test\":\"noop\",\n"
        "  \"size\":0,\"p50_us\":..,\"p10_us\":..,\"p90_us\":..,\"min_us\":..,"
        "\"max_us\":..,\n"
        "  \"gbps\":null,\"calls_per_s\":null,\"init_max_us\":null,"
        "\"calls\":..,\"reps\":3}\n"
        "(null where meaningless: latencies for async, calls_per_s except "
        "for async,\n"
        "gbps except for echo; init: p50_us = worker0's init time, "
        "init_max_us = the\n"
        "slower rank's).\n",
};

_Static_assert(BR_MAX_INFLIGHT == 1024, "the usage says this number");

// ---- options ---------------------------------------------------------------

// --transport: names of the transports compiled in (tpipe/info.h); "all"
// is every one of them, best first (those not viable here are skipped when
// their turn comes).
static bool
br_parse_transports(const char *list, br_opts *o)
{
    const char *known[TP_INFO_MAX];
    size_t nknown =
        bench_backends("bench rpc", TOOL_TRANSPORT, false, known, TP_INFO_MAX);
    char buf[128];
    o->bo_ntr = 0;
    if (strcmp(list, "all") == 0) {
        o->bo_all_tr = true;
        for (size_t k = 0; k < nknown && k < BR_MAX_TRANSPORTS; k++) {
            o->bo_tr[o->bo_ntr++] = (br_transport){known[k], known[k]};
        }
        list = "";
    }
    snprintf(buf, sizeof(buf), "%s", list);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        const char *name = NULL;
        for (size_t k = 0; k < nknown; k++) {
            if (strcmp(tok, known[k]) == 0) {
                name = known[k]; // static: outlives @buf
            }
        }
        if (name == NULL) {
            tool_backend_unknown("bench rpc", TOOL_TRANSPORT, tok, "all");
            return false;
        }
        if (o->bo_ntr == BR_MAX_TRANSPORTS) {
            tool_err("bench rpc: too many transports");
            return false;
        }
        o->bo_tr[o->bo_ntr++] = (br_transport){name, name};
    }
    if (o->bo_ntr == 0) {
        tool_err("bench rpc: --transport is empty");
        return false;
    }
    return true;
}

static bool
br_parse_tests(const char *list, br_opts *o)
{
    char buf[128];
    snprintf(buf, sizeof(buf), "%s", list);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        if (strcmp(tok, "all") == 0) {
            o->bo_noop = o->bo_echo = o->bo_async = o->bo_init = true;
            o->bo_remote = o->bo_fork = o->bo_autograd = true;
        } else if (strcmp(tok, "noop") == 0) {
            o->bo_noop = true;
        } else if (strcmp(tok, "echo") == 0) {
            o->bo_echo = true;
        } else if (strcmp(tok, "async") == 0) {
            o->bo_async = true;
        } else if (strcmp(tok, "init") == 0) {
            o->bo_init = true;
        } else if (strcmp(tok, "remote") == 0) {
            o->bo_remote = true;
        } else if (strcmp(tok, "rref_fork") == 0) {
            o->bo_fork = o->bo_fork_named = true;
        } else if (strcmp(tok, "dist_autograd") == 0) {
            o->bo_autograd = true;
        } else {
            static const char *const names[] = {
                "noop",   "echo",      "async",         "init",
                "remote", "rref_fork", "dist_autograd", "all"};
            return bench_name_check("bench rpc", "test", tok, names,
                                    TP_ARRAY_LEN(names));
        }
    }
    if (!o->bo_noop && !o->bo_echo && !o->bo_async && !o->bo_init &&
        !o->bo_remote && !o->bo_fork && !o->bo_autograd) {
        tool_err("bench rpc: --test is empty");
        return false;
    }
    return true;
}

static bool
br_parse_sizes(const char *list, br_opts *o)
{
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", list);
    o->bo_nsizes = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        uint64_t v;
        if (!tool_parse_size(tok, &v) || v == 0 || v % 4 != 0 ||
            v > (UINT64_C(1) << 34)) {
            tool_err("bench rpc: bad size \"%s\" (a multiple of 4 bytes, "
                     "4..16G)",
                     tok);
            return false;
        }
        if (o->bo_nsizes == BR_MAX_SIZES) {
            tool_err("bench rpc: at most %d sizes", BR_MAX_SIZES);
            return false;
        }
        o->bo_sizes[o->bo_nsizes++] = v;
    }
    if (o->bo_nsizes == 0) {
        tool_err("bench rpc: --sizes is empty");
        return false;
    }
    return true;
}

// Returns -1 to continue, else the exit status.
static int
br_parse_args(int argc, char **argv, br_opts *o)
{
    const char *transports = NULL, *tests = "all", *sizes = BR_DEFAULT_SIZES;
    bool launched = false;
    memset(o, 0, sizeof(*o));
    o->bo_budget = 1.0;
    o->bo_reps = 3;
    o->bo_inflight = 64;
    o->bo_stall_s = 30.0;
    uint64_t reps = 3, inflight = 64;
    const bench_opt opts[] = {
        {"--transport", NULL, BENCH_OPT_STR, &transports, 0, 0, "NAME|all",
         "transports (comma list; default all: every one\n"
         "compiled in, best first, as tpipe info lists them)"},
        {"--channel", NULL, BENCH_OPT_STR, &o->bo_channel, 0, 0, "NAME",
         "allow only this channel (default: every one)"},
        {"--test", NULL, BENCH_OPT_STR, &tests, 0, 0, "LIST|all",
         "comma list of noop, echo, async, init, remote,\nrref_fork, "
         "dist_autograd (default all)"},
        {"--sizes", NULL, BENCH_OPT_STR, &sizes, 0, 0, "LIST",
         "echo tensor sizes, K/M/G = KiB/MiB/GiB, multiples\nof 4 "
         "(default " BR_DEFAULT_SIZES ")"},
        {"--budget", NULL, BENCH_OPT_DOUBLE, &o->bo_budget, 0, 3600, "SECONDS",
         "time per measurement (default 1.0, at most 3600)"},
        {"--reps", NULL, BENCH_OPT_U64, &reps, 1, 1000, "R",
         "repetitions, each on a new pair of processes;\nreport the median "
         "(default 3, at most 1000)"},
        {"--inflight", NULL, BENCH_OPT_U64, &inflight, 1, BR_MAX_INFLIGHT, "N",
         "async calls per batch (default 64, at most 1024)"},
        {"--json", NULL, BENCH_OPT_FLAG, &o->bo_json, 0, 0, NULL,
         "one JSON object per line instead of a table"},
        {"--stall-timeout", NULL, BENCH_OPT_DOUBLE, &o->bo_stall_s, 0.1, 86400,
         "SECONDS",
         "deadline of every call, of init and of shutdown\n(default 30)"},
        {"--verbose", "-v", BENCH_OPT_FLAG, &o->bo_verbose, 0, 0, NULL,
         "progress and worker0's tp_rpc_get_debug_info\non stderr"},
        {"--launched", NULL, BENCH_OPT_FLAG, &launched, 0, 0, NULL,
         "run as one rank of a launched job (automatic when\nRANK and "
         "WORLD_SIZE are set): the ranks meet through\nTP_INIT_METHOD "
         "(default env://), rank 0 measures\nand prints, the others "
         "serve; one transport\n(default tcp)"},
    };
    int rc = bench_parse_args("bench rpc", opts, TP_ARRAY_LEN(opts), &br_usage,
                              argc, argv);
    if (rc >= 0) {
        return rc;
    }
    o->bo_reps = (unsigned)reps;
    o->bo_inflight = (unsigned)inflight;
    const bench_launch *l = &o->bo_launch;
    if (!bench_launch_get("bench rpc", launched, 2, 1 << 16, &o->bo_launch)) {
        return TOOL_EXIT_USAGE;
    }
    // Launched: one transport, across hosts tcp unless named.
    if (transports == NULL) {
        transports = l->bl_on ? "tcp" : "all";
    }
    if (!br_parse_transports(transports, o) || !br_parse_tests(tests, o) ||
        !br_parse_sizes(sizes, o)) {
        return TOOL_EXIT_USAGE;
    }
    if (l->bl_on && o->bo_ntr != 1) {
        tool_err("bench rpc: a launched run measures one transport, not "
                 "\"%s\"",
                 transports);
        return TOOL_EXIT_USAGE;
    }
    if (l->bl_on && o->bo_fork && l->bl_world < 3) {
        // rref_fork needs worker2.
        if (o->bo_fork_named) {
            tool_err("bench rpc: rref_fork needs a third rank (WORLD_SIZE "
                     "3 or more, not %d)",
                     l->bl_world);
            return TOOL_EXIT_USAGE;
        }
        o->bo_fork = false;
        if (l->bl_rank == 0) {
            tool_err("bench rpc: leaving out rref_fork: it needs a third "
                     "rank (WORLD_SIZE is %d)",
                     l->bl_world);
        }
    }
    if (o->bo_channel != NULL &&
        !tool_backend_known(TOOL_PIPE_CHANNEL, o->bo_channel)) {
        tool_backend_unknown("bench rpc", TOOL_PIPE_CHANNEL, o->bo_channel,
                             NULL);
        return TOOL_EXIT_USAGE;
    }
    if (!bench_env_check()) {
        return TOOL_EXIT_USAGE;
    }
    return -1;
}

// ---- output ----------------------------------------------------------------

// Medians over the repetitions of a cell.
typedef struct br_row {
    double f[BR_NF];
} br_row;

static void
br_medians(br_run *r, size_t cell, br_row *m)
{
    unsigned n = r->rr_nreps;
    for (int f = 0; f < BR_NF; f++) {
        double *v = br_val(r, cell, f, 0);
        double tmp[1000];
        size_t k = 0;
        for (unsigned i = 0; i < n; i++) {
            if (isfinite(v[i])) {
                tmp[k++] = v[i];
            }
        }
        m->f[f] = tool_median(tmp, k);
        if (f == BR_F_CALLS) {
            double s = 0;
            for (size_t i = 0; i < k; i++) {
                s += tmp[i];
            }
            m->f[f] = k ? s : NAN;
        }
    }
}

static const bench_col br_cols[] = {
    {"transport", -9, "transport", BENCH_COL_STR, 0},
    {"channel", -7, "channel", BENCH_COL_STR, 0},
    {"test", -13, "test", BENCH_COL_STR, 0},
    {"size", 5, "size", BENCH_COL_SIZE, 0},
    {"p50_us", 10, "p50_us", BENCH_COL_NUM, 2},
    {"p10_us", 10, "p10_us", BENCH_COL_NUM, 2},
    {"p90_us", 10, "p90_us", BENCH_COL_NUM, 2},
    {"min_us", 10, "min_us", BENCH_COL_NUM, 2},
    {NULL, 0, "max_us", BENCH_COL_NUM, 2},
    {"GB/s", 8, "gbps", BENCH_COL_NUM, 3},
    {"calls/s", 10, "calls_per_s", BENCH_COL_NUM, 0},
    {"init_max_us", 11, "init_max_us", BENCH_COL_NUM, 0},
    {"calls", 8, "calls", BENCH_COL_NUM, 0},
    {NULL, 0, "reps", BENCH_COL_U64, 0},
};

static void
br_print_cell(br_run *r, size_t cell, const char *test, uint64_t size,
              bench_out *out)
{
    br_row m;
    br_medians(r, cell, &m);
    if (size > 0) {
        // GB/s of the reported p50 (a median of per-repetition GB/s would
        // not match it).
        m.f[BR_F_GBPS] = 2 * (double)size / m.f[BR_F_P50] / 1e3;
    }
    const bench_val v[TP_ARRAY_LEN(br_cols)] = {
        {.v_str = r->rr_tr->bt_name},
        {.v_str = r->rr_channel[0] != '\0' ? r->rr_channel : NULL},
        {.v_str = test},
        {.v_u64 = size},
        {.v_num = m.f[BR_F_P50]},
        {.v_num = m.f[BR_F_P10]},
        {.v_num = m.f[BR_F_P90]},
        {.v_num = m.f[BR_F_MIN]},
        {.v_num = m.f[BR_F_MAX]},
        {.v_num = m.f[BR_F_GBPS]},
        {.v_num = m.f[BR_F_CPS]},
        {.v_num = m.f[BR_F_RANKS_MAX]},
        {.v_num = m.f[BR_F_CALLS]},
        {.v_u64 = r->rr_nreps},
    };
    bench_out_row(out, v);
}

// The rows of one pass (the 2-worker tests, or rref_fork's), once its last
// repetition completed.
static void
br_print_pass(br_run *r, bool fork_pass, bench_out *out)
{
    const br_opts *o = r->rr_opts;
    if (fork_pass) {
        br_print_cell(r, BR_C_FORK, "rref_fork", 0, out);
        return;
    }
    if (o->bo_noop) {
        br_print_cell(r, BR_C_NOOP, "noop", 0, out);
    }
    for (size_t i = 0; o->bo_echo && i < o->bo_nsizes; i++) {
        br_print_cell(r, BR_C_ECHO + i, "echo", o->bo_sizes[i], out);
    }
    if (o->bo_async) {
        br_print_cell(r, BR_C_ASYNC, "async", 0, out);
    }
    if (o->bo_init) {
        br_print_cell(r, BR_C_INIT, "init", 0, out);
    }
    if (o->bo_remote) {
        br_print_cell(r, BR_C_REMOTE, "remote", 0, out);
    }
    if (o->bo_autograd) {
        br_print_cell(r, BR_C_AUTOGRAD, "dist_autograd", 0, out);
    }
}

// ---- main ------------------------------------------------------------------

int
tool_bench_rpc_main(int argc, char **argv)
{
    br_opts o;
    int rc = br_parse_args(argc, argv, &o);
    if (rc >= 0) {
        return rc;
    }
    // A write to a dead peer must be an error, not a signal.
    signal(SIGPIPE, SIG_IGN);
    // Before any fork: every worker then has the function.
    char why_reg[512];
    if (o.bo_autograd && !br_autograd_register(why_reg, sizeof(why_reg))) {
        tool_err("bench rpc: %s", why_reg);
        return TOOL_EXIT_FAIL;
    }

    bench_out out;
    bench_out_init(&out, "rpc", br_cols, TP_ARRAY_LEN(br_cols), o.bo_json);

    size_t ncells = BR_C_ECHO + o.bo_nsizes;
    double *vals = malloc(ncells * BR_NF * o.bo_reps * sizeof(double));
    if (vals == NULL) {
        tool_err("out of memory");
        return TOOL_EXIT_FAIL;
    }
    bool failed = false;
    size_t measured = 0;
    for (size_t ti = 0; ti < o.bo_ntr; ti++) {
        const br_transport *tr = &o.bo_tr[ti];
        // A transport that cannot work here is skipped before forking.
        if (!bench_viable("bench rpc", tr->bt_name, TOOL_TRANSPORT,
                          tr->bt_name)) {
            if (!o.bo_all_tr) {
                failed = true;
            }
            continue;
        }
        br_run r;
        memset(&r, 0, sizeof(r));
        r.rr_opts = &o;
        r.rr_tr = tr;
        r.rr_ncells = ncells;
        r.rr_vals = vals;
        r.rr_base_threads = br_thread_count();
        for (size_t i = 0; i < ncells * BR_NF * o.bo_reps; i++) {
            vals[i] = NAN;
        }
        bool two = o.bo_noop || o.bo_echo || o.bo_async || o.bo_init ||
                   o.bo_remote || o.bo_autograd;
        if (o.bo_launch.bl_on) {
            // Rank 0 prints its rows; the others serve and print nothing.
            bool ok = br_run_launched(&r);
            if (ok && o.bo_launch.bl_rank == 0) {
                if (two) {
                    br_print_pass(&r, false, &out);
                }
                if (o.bo_fork) {
                    br_print_pass(&r, true, &out);
                }
            }
            if (!ok) {
                fflush(stdout);
                tool_err("bench rpc: %s: launched rank %d of %d (%s): %s",
                         tr->bt_name, o.bo_launch.bl_rank, o.bo_launch.bl_world,
                         o.bo_launch.bl_url, r.rr_err);
                failed = true;
            } else {
                measured++;
            }
            continue;
        }
        bool ok = true;
        for (unsigned rep = 0; rep < o.bo_reps && ok; rep++) {
            tool_verbose(o.bo_verbose, "bench rpc", "%s: repetition %u of %u",
                         tr->bt_name, rep + 1, o.bo_reps);
            // The 2-worker tests, then rref_fork with a third worker. The
            // last repetition prints each pass's rows as it completes.
            bool last = rep + 1 == o.bo_reps;
            r.rr_fork_pass = false;
            ok = !two || br_run_rep(&r, rep);
            if (ok && two && last) {
                r.rr_nreps = o.bo_reps;
                br_print_pass(&r, false, &out);
            }
            if (ok && o.bo_fork) {
                r.rr_fork_pass = true;
                ok = br_run_rep(&r, rep);
                if (ok && last) {
                    r.rr_nreps = o.bo_reps;
                    br_print_pass(&r, true, &out);
                }
            }
            if (ok) {
                r.rr_nreps = rep + 1;
            }
        }
        if (!ok) {
            fflush(stdout);
            tool_err("bench rpc: %s: %s", tr->bt_name, r.rr_err);
            failed = true;
            continue;
        }
        measured++;
    }
    free(vals);
    if (measured == 0 && !failed) {
        tool_err("bench rpc: no transport could be measured here");
        failed = true;
    }
    return failed ? TOOL_EXIT_FAIL : TOOL_EXIT_OK;
}
