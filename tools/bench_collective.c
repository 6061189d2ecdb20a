// SPDX-License-Identifier: Apache-2.0
// bench_collective.c - `tpipe bench collective`: the collectives of a
// process group (include/tpipe/collectives.h) between --world forked ranks
// on this host, reported the way nccl-tests reports NCCL's.
//
// Each repetition is a fresh set of ranks: this process (which never
// creates a thread, so forking is safe) forks --world children that meet
// through a file:// store in a new temporary directory (or tcp:// on a
// free loopback port with --store tcp) and create the world group. Every
// rank then runs the same sequence of measurements, one per op and size:
//
//   1. check: fill the buffers with known small integers, run the op once,
//      compare every element with the expected result; an all_reduce(max)
//      of a flag makes every rank stop if any rank saw a wrong value, so
//      no number is ever reported for a wrong result;
//   2. zero the buffers (repeated in-place sums stay finite), --warmup
//      calls;
//   3. unless --iters is given: calibrate, doubling a batch of calls until
//      it takes 1/20 of --budget (the batch time is an all_reduce(max), so
//      every rank takes the same decisions), then iters = budget / time
//      per call, at least 5;
//   4. a barrier, then `iters` blocking calls timed on every rank; the
//      mean time per call is reduced with max to rank 0 (tp_pg_reduce),
//      which reports it to this process in one line.
//
// Ranks report on one pipe(2) shared by all of them: lines "<rank> <word>
// ...", each written with one write(2) shorter than PIPE_BUF (atomic).
// This process waits with a deadline (--timeout per repetition) and kills
// the ranks when it passes or shortly after a rank reported an error. The
// output is, per op and size, the median over repetitions of the time per
// call; algbw = size / time, busbw = algbw * nccl-tests' factor.

#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/platform.h"
#include "tool.h"
#include "bench_collective.h"
#include "bench_common.h"

// ---- ops -------------------------------------------------------------------

const bc_op bc_ops[BC_NKINDS] = {
    [BC_ALL_REDUCE] = {"all_reduce", "tp_pg_all_reduce", false,
                       BC_BUS_ALLREDUCE},
    [BC_ALL_GATHER] = {"all_gather", "tp_pg_all_gather", true, BC_BUS_SPREAD},
    [BC_REDUCE_SCATTER] = {"reduce_scatter", "tp_pg_reduce_scatter", true,
                           BC_BUS_SPREAD},
    [BC_BROADCAST] = {"broadcast", "tp_pg_broadcast", false, BC_BUS_ONE},
    [BC_REDUCE] = {"reduce", "tp_pg_reduce", false, BC_BUS_ONE},
    [BC_ALL_TO_ALL] = {"all_to_all", "tp_pg_all_to_all", true, BC_BUS_SPREAD},
    [BC_BARRIER] = {"barrier", "tp_pg_barrier", false, BC_BUS_NONE},
    [BC_GATHER] = {"gather", "tp_pg_gather", true, BC_BUS_SPREAD},
    [BC_SCATTER] = {"scatter", "tp_pg_scatter", true, BC_BUS_SPREAD},
};

double
bc_bus_factor(bc_kind k, int n)
{
    switch (bc_ops[k].op_bus) {
    case BC_BUS_ALLREDUCE:
        return 2.0 * (n - 1) / n;
    case BC_BUS_SPREAD:
        return (double)(n - 1) / n;
    case BC_BUS_ONE:
        return 1.0;
    case BC_BUS_NONE:
        break;
    }
    return 0.0;
}

static const bench_usage bc_usage = {
    .bu_head = "usage: tpipe bench collective [options]\n"
               "\n"
               "Collectives of a process group between --world forked ranks "
               "on this host\n"
               "(nccl-tests style). Each repetition is a fresh set of ranks "
               "that meet through\n"
               "a file:// store (or tcp://127.0.0.1:PORT) and create the "
               "world group.\n",
    .bu_tail =
        "size: all_reduce, broadcast, reduce: the buffer; all_gather, "
        "gather: the\n"
        "output (world x input); reduce_scatter, scatter: the input (world x "
        "output);\n"
        "all_to_all: the buffer sent by each rank; barrier: 0. For the "
        "blocked ops the\n"
        "element count is rounded down to a multiple of the world size.\n"
        "time_us: mean time per call, the max over ranks. algbw = size / "
        "time (GB/s,\n"
        "1e9 B/s); busbw = algbw x 2(n-1)/n (all_reduce), (n-1)/n "
        "(all_gather,\n"
        "reduce_scatter, all_to_all, gather, scatter), 1 (broadcast, "
        "reduce), 0 (barrier).\n"
        "\n"
        "JSON line: {\"bench\":\"collective\",\"op\":\"all_reduce\","
        "\"size\":4096,\"count\":1024,\n"
        "  \"dtype\":\"f32\",\"world\":2,\"engine\":\"shm\",\"time_us\":..,"
        "\"algbw_gbps\":..,\n"
        "  \"busbw_gbps\":..,\"busbw_factor\":1,\"iters\":..,\"warmup\":5,"
        "\"time_min_us\":..,\n"
        "  \"time_max_us\":..,\"reps\":3}\n",
};

_Static_assert(BC_MAX_WORLD == 64 && BC_MIN_ITERS == 5 && BC_MAX_REPS == 1000,
               "the usage says these numbers");

static bool
bc_parse_ops(const char *list, bc_opts *o)
{
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", list);
    o->bo_nops = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        bool all = strcmp(tok, "all") == 0, found = all;
        for (int k = 0; k < BC_NKINDS; k++) {
            if (!all && strcmp(tok, bc_ops[k].op_name) != 0) {
                continue;
            }
            found = true;
            bool dup = false;
            for (size_t j = 0; j < o->bo_nops; j++) {
                dup = dup || o->bo_ops[j] == (bc_kind)k;
            }
            if (!dup) {
                o->bo_ops[o->bo_nops++] = (bc_kind)k;
            }
        }
        if (!found) {
            const char *names[BC_NKINDS + 1];
            for (int k = 0; k < BC_NKINDS; k++) {
                names[k] = bc_ops[k].op_name;
            }
            names[BC_NKINDS] = "all";
            return bench_name_check("bench collective", "op", tok, names,
                                    BC_NKINDS + 1);
        }
    }
    if (o->bo_nops == 0) {
        tool_err("bench collective: --op is empty");
        return false;
    }
    return true;
}

// A size of --sizes, --min-bytes or --max-bytes: a positive multiple of
// the dtype's size, at most 4G.
static bool
bc_parse_one_size(const char *s, const char *what, const bc_opts *o,
                  uint64_t *v_p)
{
    size_t es = tp_dtype_size(o->bo_dtype);
    uint64_t v = 0;
    if (!tool_parse_size(s, &v) || v == 0 || v % es != 0 || v > BC_MAX_SIZE) {
        tool_err("bench collective: bad %s \"%s\" (a positive multiple of %zu "
                 "bytes, the size of %s, at most 4G)",
                 what, s, es, tp_dtype_name(o->bo_dtype));
        return false;
    }
    *v_p = v;
    return true;
}

static bool
bc_parse_sizes(const char *sizes, const char *min_b, const char *max_b,
               const char *factor, bc_opts *o)
{
    o->bo_nsizes = 0;
    if (sizes != NULL && (min_b != NULL || max_b != NULL || factor != NULL)) {
        tool_err("bench collective: --sizes and --min-bytes/--max-bytes/"
                 "--factor exclude each other");
        return false;
    }
    if (min_b != NULL || max_b != NULL || factor != NULL) {
        uint64_t lo = 4096, hi = 64u << 20, f = 2;
        if ((min_b != NULL &&
             !bc_parse_one_size(min_b, "--min-bytes", o, &lo)) ||
            (max_b != NULL &&
             !bc_parse_one_size(max_b, "--max-bytes", o, &hi))) {
            return false;
        }
        if (factor != NULL && (!tool_parse_u64(factor, &f) || f < 2)) {
            tool_err("bench collective: bad --factor \"%s\" (an integer >= "
                     "2)",
                     factor);
            return false;
        }
        if (lo > hi) {
            tool_err("bench collective: --min-bytes is above --max-bytes");
            return false;
        }
        for (uint64_t v = lo; v <= hi; v *= f) {
            if (o->bo_nsizes == BC_MAX_SIZES) {
                tool_err("bench collective: at most %d sizes", BC_MAX_SIZES);
                return false;
            }
            o->bo_sizes[o->bo_nsizes++] = v;
            if (v > hi / f) {
                break;
            }
        }
        return true;
    }
    char buf[1024];
    snprintf(buf, sizeof(buf), "%s", sizes != NULL ? sizes : BC_DEFAULT_SIZES);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        uint64_t v;
        if (!bc_parse_one_size(tok, "size", o, &v)) {
            return false;
        }
        if (o->bo_nsizes == BC_MAX_SIZES) {
            tool_err("bench collective: at most %d sizes", BC_MAX_SIZES);
            return false;
        }
        o->bo_sizes[o->bo_nsizes++] = v;
    }
    if (o->bo_nsizes == 0) {
        tool_err("bench collective: --sizes is empty");
        return false;
    }
    return true;
}

static bool
bc_parse_dtype(const char *s, bc_opts *o)
{
    static const tp_dtype ok[] = {TP_F32, TP_F64, TP_I32, TP_I64};
    const char *names[TP_ARRAY_LEN(ok)];
    for (size_t k = 0; k < TP_ARRAY_LEN(ok); k++) {
        names[k] = tp_dtype_name(ok[k]);
        if (strcmp(s, names[k]) == 0) {
            o->bo_dtype = ok[k];
            return true;
        }
    }
    return bench_name_check("bench collective", "dtype", s, names,
                            TP_ARRAY_LEN(ok));
}

// Returns -1 to continue, else the exit status.
int
bc_parse_args(int argc, char **argv, bc_opts *o)
{
    const char *ops = "all_reduce", *sizes = NULL, *min_b = NULL;
    const char *max_b = NULL, *factor = NULL, *dtype = "f32";
    memset(o, 0, sizeof(*o));
    o->bo_world = 0; // given, or 2 (launched: WORLD_SIZE)
    o->bo_warmup = 5;
    o->bo_reps = 3;
    o->bo_engine = "auto";
    o->bo_budget = 0.1;
    o->bo_timeout_s = 120;
    const char *store = NULL;
    bool launched = false;
    uint64_t world = 0, warmup = 5, reps = 3;
    const bench_opt opts[] = {
        {"--op", NULL, BENCH_OPT_STR, &ops, 0, 0, "LIST",
         "comma list of all_reduce, all_gather,\nreduce_scatter, broadcast, "
         "reduce, all_to_all,\nbarrier, gather, scatter, or all (default "
         "all_reduce)"},
        {"--world", NULL, BENCH_OPT_U64, &world, 1, BC_MAX_WORLD, "N",
         "ranks, 1..64 (default 2)"},
        {"--sizes", NULL, BENCH_OPT_STR, &sizes, 0, 0, "LIST",
         "bytes of each op's main buffer, K/M/G =\n"
         "KiB/MiB/GiB (default " BC_DEFAULT_SIZES ")"},
        {"--min-bytes", NULL, BENCH_OPT_STR, &min_b, 0, 0, "B",
         "instead of --sizes: B, B*factor, ... up to\n--max-bytes "
         "(defaults 4K, 64M, factor 2)"},
        {"--max-bytes", NULL, BENCH_OPT_STR, &max_b, 0, 0, "B",
         "the largest size of that series"},
        {"--factor", NULL, BENCH_OPT_STR, &factor, 0, 0, "2|4",
         "the series' factor"},
        {"--dtype", NULL, BENCH_OPT_STR, &dtype, 0, 0, "f32|f64|i32|i64",
         "element type (default f32); reductions are sums"},
        {"--iters", NULL, BENCH_OPT_U64, &o->bo_iters, 1, BC_MAX_ITERS, "N",
         "timed calls per measurement (default:\ncalibrated to --budget, at "
         "least 5)"},
        {"--budget", NULL, BENCH_OPT_DOUBLE, &o->bo_budget, 1e-6, 3600,
         "SECONDS",
         "time per measurement when calibrating (default 0.1,\nat most "
         "3600)"},
        {"--warmup", NULL, BENCH_OPT_U64, &warmup, 0, 1000000, "N",
         "untimed calls before each measurement (default 5)"},
        {"--reps", NULL, BENCH_OPT_U64, &reps, 1, BC_MAX_REPS, "R",
         "repetitions, each on fresh ranks; report the median\n(default 3, "
         "at most 1000)"},
        {"--engine", NULL, BENCH_OPT_STR, &o->bo_engine, 0, 0, "auto|shm|pipe",
         "TP_COLL_ENGINE of the ranks (default auto)"},
        {"--store", NULL, BENCH_OPT_STR, &store, 0, 0, "file|tcp",
         "how the ranks meet (default file)"},
        {"--launched", NULL, BENCH_OPT_FLAG, &launched, 0, 0, NULL,
         "run as one rank of a launched job (automatic when\nRANK and "
         "WORLD_SIZE are set): the world is\nWORLD_SIZE, the ranks meet "
         "through TP_INIT_METHOD\n(default env://), rank 0 prints"},
        {"--no-bind", NULL, BENCH_OPT_FLAG, &o->bo_no_bind, 0, 0, NULL,
         "do not bind rank r to CPU r % ncpus (bound by\ndefault, as mpirun "
         "--bind-to core)"},
        {"--timeout", NULL, BENCH_OPT_DOUBLE, &o->bo_timeout_s, 1, 86400,
         "SECONDS",
         "limit of one repetition; the ranks are\nkilled after it (default "
         "120)"},
        {"--json", NULL, BENCH_OPT_FLAG, &o->bo_json, 0, 0, NULL,
         "one JSON object per line instead of the table"},
        {"--plot", NULL, BENCH_OPT_STR, &o->bo_plot, 0, 0, "FILE.svg",
         "also write an SVG: busbw and the time per call\nagainst size, one "
         "curve per op"},
        {"--verbose", "-v", BENCH_OPT_FLAG, &o->bo_verbose, 0, 0, NULL,
         "progress on stderr"},
    };
    int rc = bench_parse_args("bench collective", opts, TP_ARRAY_LEN(opts),
                              &bc_usage, argc, argv);
    if (rc >= 0) {
        return rc;
    }
    o->bo_warmup = (unsigned)warmup;
    o->bo_reps = (unsigned)reps;
    static const char *const engines[] = {"auto", "shm", "pipe"};
    static const char *const stores[] = {"file", "tcp"};
    if (!bench_name_check("bench collective", "engine", o->bo_engine, engines,
                          TP_ARRAY_LEN(engines)) ||
        (store != NULL && !bench_name_check("bench collective", "store", store,
                                            stores, TP_ARRAY_LEN(stores)))) {
        return TOOL_EXIT_USAGE;
    }
    o->bo_tcp = store != NULL && strcmp(store, "tcp") == 0;
    if (!bench_launch_get("bench collective", launched, 1, BC_MAX_WORLD,
                          &o->bo_launch)) {
        return TOOL_EXIT_USAGE;
    }
    if (o->bo_launch.bl_on && (world != 0 || store != NULL)) {
        tool_err("bench collective: a launched run's world is WORLD_SIZE and "
                 "its ranks meet through TP_INIT_METHOD (default env://): "
                 "not with --world or --store");
        return TOOL_EXIT_USAGE;
    }
    o->bo_world = o->bo_launch.bl_on ? o->bo_launch.bl_world
                  : world != 0       ? (int)world
                                     : 2;
    if (!bc_parse_ops(ops, o) || !bc_parse_dtype(dtype, o) ||
        !bc_parse_sizes(sizes, min_b, max_b, factor, o)) {
        return TOOL_EXIT_USAGE;
    }
    // A blocked op needs at least one element per rank.
    size_t es = tp_dtype_size(o->bo_dtype);
    for (size_t j = 0; j < o->bo_nops; j++) {
        if (!bc_ops[o->bo_ops[j]].op_blocked) {
            continue;
        }
        for (size_t s = 0; s < o->bo_nsizes; s++) {
            if (o->bo_sizes[s] / es < (uint64_t)o->bo_world) {
                tool_err("bench collective: size %llu is too small for %s "
                         "over %d ranks (one %s per rank at least)",
                         (unsigned long long)o->bo_sizes[s],
                         bc_ops[o->bo_ops[j]].op_name, o->bo_world,
                         tp_dtype_name(o->bo_dtype));
                return TOOL_EXIT_USAGE;
            }
        }
    }
    return -1;
}

// The measurements, in order: for each op, each size (barrier: one).
// Returns how many were stored in @cells (allocated by the caller with
// room for nops * nsizes).
size_t
bc_cells(const bc_opts *o, bc_cell *cells)
{
    size_t n = 0, es = tp_dtype_size(o->bo_dtype);
    uint64_t w = (uint64_t)o->bo_world;
    for (size_t j = 0; j < o->bo_nops; j++) {
        bc_kind k = o->bo_ops[j];
        if (k == BC_BARRIER) {
            cells[n++] = (bc_cell){.c_kind = k};
            continue;
        }
        for (size_t s = 0; s < o->bo_nsizes; s++) {
            uint64_t count = o->bo_sizes[s] / es;
            uint64_t block = count;
            if (bc_ops[k].op_blocked) {
                block = count / w;
                count = block * w;
            }
            cells[n++] = (bc_cell){.c_kind = k,
                                   .c_size = count * es,
                                   .c_count = count,
                                   .c_block = block};
        }
    }
    return n;
}

void
bc_cell_name(const bc_cell *c, char *buf, size_t len)
{
    if (c->c_kind == BC_BARRIER) {
        snprintf(buf, len, "barrier");
        return;
    }
    char sz[32];
    tool_format_size(c->c_size, sz, sizeof(sz));
    snprintf(buf, len, "%s, size %s (%llu bytes)", bc_ops[c->c_kind].op_name,
             sz, (unsigned long long)c->c_size);
}

// ---- main ------------------------------------------------------------------

int
tool_bench_collective_main(int argc, char **argv)
{
    bc_opts o;
    int rc = bc_parse_args(argc, argv, &o);
    if (rc >= 0) {
        return rc;
    }
    // A write to a dead reader must be an error, not a signal.
    signal(SIGPIPE, SIG_IGN);

    bc_cell *cells = calloc(o.bo_nops * o.bo_nsizes, sizeof(*cells));
    size_t ncells = cells != NULL ? bc_cells(&o, cells) : 0;
    bc_results res = {.rs_ncells = ncells, .rs_reps = o.bo_reps};
    res.rs_time = calloc(ncells * o.bo_reps, sizeof(double));
    res.rs_iters = calloc(ncells * o.bo_reps, sizeof(double));
    if (cells == NULL || res.rs_time == NULL || res.rs_iters == NULL) {
        tool_err("out of memory");
        free(cells);
        free(res.rs_time);
        free(res.rs_iters);
        return TOOL_EXIT_FAIL;
    }
    for (size_t i = 0; i < ncells * o.bo_reps; i++) {
        res.rs_time[i] = res.rs_iters[i] = NAN;
    }
    bool ok = true;
    const bench_launch *l = &o.bo_launch;
    // Launched: this job's rank runs every repetition in one group.
    unsigned runs = l->bl_on ? 1 : o.bo_reps;
    for (unsigned rep = 0; rep < runs && ok; rep++) {
        tool_verbose(o.bo_verbose, "bench collective",
                     "repetition %u of %u: %d ranks", rep + 1, runs,
                     o.bo_world);
        bc_rep *p = calloc(1, sizeof(*p));
        if (p == NULL) {
            tool_err("out of memory");
            ok = false;
            break;
        }
        p->rp_opts = &o;
        p->rp_cells = cells;
        p->rp_ncells = ncells;
        p->rp_rep = rep;
        p->rp_res = &res;
        p->rp_first = l->bl_on ? l->bl_rank : 0;
        p->rp_nlocal = l->bl_on ? 1 : o.bo_world;
        ok = bc_run_rep(p);
        if (!ok && l->bl_on) {
            fflush(stdout);
            tool_err("bench collective: launched rank %d of %d (%s, engine "
                     "%s): %s",
                     l->bl_rank, l->bl_world, l->bl_url, o.bo_engine,
                     p->rp_err);
        } else if (!ok) {
            fflush(stdout);
            tool_err("bench collective: repetition %u of %u (world %d, "
                     "engine %s): %s",
                     rep + 1, o.bo_reps, o.bo_world, o.bo_engine, p->rp_err);
        }
        free(p);
    }
    // Launched: rank 0 has the results.
    if (ok && (!l->bl_on || l->bl_rank == 0)) {
        if (o.bo_plot != NULL && !bc_plot(&o, &res, cells, ncells)) {
            ok = false;
        }
    }
    free(cells);
    free(res.rs_time);
    free(res.rs_iters);
    return ok ? TOOL_EXIT_OK : TOOL_EXIT_FAIL;
}
