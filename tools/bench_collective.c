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

#include <tpipe/collectives.h>
#include <tpipe/tpipe.h>

#include "core/platform.h"
#include "tool.h"

#define BC_MAX_WORLD     64
#define BC_MAX_SIZES     64
#define BC_MAX_REPS      1000
#define BC_MIN_ITERS     5
#define BC_MAX_ITERS     10000000u
#define BC_MAX_SIZE      (UINT64_C(1) << 32)
#define BC_DEFAULT_SIZES "4K,64K,1M,16M,64M"
#define BC_LINE_MAX      1024 // < PIPE_BUF: one atomic write per line
#define BC_ERROR_GRACE_S 3.0  // after a rank's error, the others' time

// ---- ops -------------------------------------------------------------------

typedef enum bc_kind {
    BC_ALL_REDUCE,
    BC_ALL_GATHER,
    BC_REDUCE_SCATTER,
    BC_BROADCAST,
    BC_REDUCE,
    BC_ALL_TO_ALL,
    BC_BARRIER,
    BC_GATHER,
    BC_SCATTER,
    BC_NKINDS
} bc_kind;

// How busbw follows from algbw (nccl-tests' factors, n = world size).
typedef enum bc_bus {
    BC_BUS_ALLREDUCE, // 2(n-1)/n
    BC_BUS_SPREAD,    // (n-1)/n
    BC_BUS_ONE,       // 1
    BC_BUS_NONE,      // barrier: no bytes
} bc_bus;

typedef struct bc_op {
    const char *op_name;
    const char *op_call; // for error messages
    bool op_blocked;     // the buffer is n blocks: count % n == 0
    bc_bus op_bus;
} bc_op;

static const bc_op bc_ops[BC_NKINDS] = {
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

static double
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

// ---- options ---------------------------------------------------------------

typedef struct bc_opts {
    bc_kind bo_ops[BC_NKINDS];
    size_t bo_nops;
    int bo_world;
    uint64_t bo_sizes[BC_MAX_SIZES];
    size_t bo_nsizes;
    tp_dtype bo_dtype;
    uint64_t bo_iters; // 0: calibrated
    unsigned bo_warmup;
    unsigned bo_reps;
    const char *bo_engine; // "auto", "shm", "pipe"
    bool bo_tcp;           // --store tcp
    double bo_budget;      // seconds per measurement (calibrated iters)
    double bo_timeout_s;   // per repetition
    bool bo_json;
    bool bo_verbose;
    bool bo_no_bind; // --no-bind: leave placement to the scheduler
    const char *bo_plot;
} bc_opts;

// One measurement: an op at one size (barrier: one, size 0).
typedef struct bc_cell {
    bc_kind c_kind;
    uint64_t c_size;  // bytes of the op's main buffer (see bc_usage)
    uint64_t c_count; // elements of that buffer
    uint64_t c_block; // blocked ops: elements per rank block, else c_count
} bc_cell;

static void
bc_usage(FILE *f)
{
    fprintf(
        f,
        "usage: tpipe bench collective [options]\n"
        "\n"
        "Collectives of a process group between --world forked ranks on "
        "this host\n"
        "(nccl-tests style). Each repetition is a fresh set of ranks that "
        "meet through\n"
        "a file:// store (or tcp://127.0.0.1:PORT) and create the world "
        "group.\n"
        "\n"
        "  --op LIST            comma list of all_reduce, all_gather, "
        "reduce_scatter,\n"
        "                       broadcast, reduce, all_to_all, barrier, "
        "gather, scatter,\n"
        "                       or all (default all_reduce)\n"
        "  --world N            ranks, 1..%d (default 2)\n"
        "  --sizes LIST         bytes of each op's main buffer, K/M/G = "
        "KiB/MiB/GiB\n"
        "                       (default %s)\n"
        "  --min-bytes B, --max-bytes B, --factor 2|4\n"
        "                       instead of --sizes: B, B*factor, ... up to "
        "max\n"
        "                       (defaults 4K, 64M, 2)\n"
        "  --dtype f32|f64|i32|i64   element type (default f32); reductions "
        "are sums\n"
        "  --iters N            timed calls per measurement (default: "
        "calibrated to\n"
        "                       --budget, at least %d)\n"
        "  --budget SECONDS     time per measurement when calibrating "
        "(default 0.1)\n"
        "  --warmup N           untimed calls before each measurement "
        "(default 5)\n"
        "  --reps R             repetitions, each on fresh ranks; report the "
        "median\n"
        "                       (default 3)\n"
        "  --engine auto|shm|pipe   TP_COLL_ENGINE of the ranks (default "
        "auto)\n"
        "  --store file|tcp     how the ranks meet (default file)\n"
        "  --no-bind            do not bind rank r to CPU r %% ncpus (bound "
        "by default,\n"
        "                       as mpirun --bind-to core)\n"
        "  --timeout SECONDS    limit of one repetition; the ranks are "
        "killed after it\n"
        "                       (default 120)\n"
        "  --json               one JSON object per line instead of the "
        "table\n"
        "  --plot FILE          also write a gnuplot script FILE (busbw "
        "against size,\n"
        "                       data inline; `gnuplot FILE` writes FILE's "
        "name .svg)\n"
        "                       and its data as FILE.dat\n"
        "  -v, --verbose        progress on stderr\n"
        "\n"
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
        BC_MAX_WORLD, BC_DEFAULT_SIZES, BC_MIN_ITERS);
}

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
            tool_err("bench collective: unknown op \"%s\" (all_reduce, "
                     "all_gather, reduce_scatter, broadcast, reduce, "
                     "all_to_all, barrier, gather, scatter, all)",
                     tok);
            return false;
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
    for (size_t k = 0; k < TP_ARRAY_LEN(ok); k++) {
        if (strcmp(s, tp_dtype_name(ok[k])) == 0) {
            o->bo_dtype = ok[k];
            return true;
        }
    }
    tool_err("bench collective: unsupported --dtype \"%s\" (f32, f64, i32, "
             "i64)",
             s);
    return false;
}

// Returns -1 to continue, else the exit status.
static int
bc_parse_args(int argc, char **argv, bc_opts *o)
{
    const char *ops = "all_reduce", *sizes = NULL, *min_b = NULL;
    const char *max_b = NULL, *factor = NULL, *dtype = "f32";
    memset(o, 0, sizeof(*o));
    o->bo_world = 2;
    o->bo_warmup = 5;
    o->bo_reps = 3;
    o->bo_engine = "auto";
    o->bo_budget = 0.1;
    o->bo_timeout_s = 120;
    for (int i = 1; i < argc; i++) {
        const char *v = NULL, *a = argv[i];
        bool bad = false;
        uint64_t u = 0;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            bc_usage(stdout);
            return TOOL_EXIT_OK;
        } else if (strcmp(a, "--json") == 0) {
            o->bo_json = true;
        } else if (strcmp(a, "-v") == 0 || strcmp(a, "--verbose") == 0) {
            o->bo_verbose = true;
        } else if (strcmp(a, "--no-bind") == 0) {
            o->bo_no_bind = true;
        } else if (tool_opt_value(argc, argv, &i, "--op", &v, &bad)) {
            ops = v;
        } else if (tool_opt_value(argc, argv, &i, "--sizes", &v, &bad)) {
            sizes = v;
        } else if (tool_opt_value(argc, argv, &i, "--min-bytes", &v, &bad)) {
            min_b = v;
        } else if (tool_opt_value(argc, argv, &i, "--max-bytes", &v, &bad)) {
            max_b = v;
        } else if (tool_opt_value(argc, argv, &i, "--factor", &v, &bad)) {
            factor = v;
        } else if (tool_opt_value(argc, argv, &i, "--dtype", &v, &bad)) {
            dtype = v;
        } else if (tool_opt_value(argc, argv, &i, "--plot", &v, &bad)) {
            o->bo_plot = v;
        } else if (tool_opt_value(argc, argv, &i, "--world", &v, &bad)) {
            if (!bad && (!tool_parse_u64(v, &u) || u < 1 || u > BC_MAX_WORLD)) {
                tool_err("bench collective: --world must be 1..%d, not "
                         "\"%s\"",
                         BC_MAX_WORLD, v);
                bad = true;
            }
            o->bo_world = (int)u;
        } else if (tool_opt_value(argc, argv, &i, "--iters", &v, &bad)) {
            if (!bad && (!tool_parse_u64(v, &u) || u < 1 || u > BC_MAX_ITERS)) {
                tool_err("bench collective: --iters must be 1..%u",
                         BC_MAX_ITERS);
                bad = true;
            }
            o->bo_iters = u;
        } else if (tool_opt_value(argc, argv, &i, "--warmup", &v, &bad)) {
            if (!bad && (!tool_parse_u64(v, &u) || u > 1000000)) {
                tool_err("bench collective: --warmup must be 0..1000000");
                bad = true;
            }
            o->bo_warmup = (unsigned)u;
        } else if (tool_opt_value(argc, argv, &i, "--reps", &v, &bad)) {
            if (!bad && (!tool_parse_u64(v, &u) || u < 1 || u > BC_MAX_REPS)) {
                tool_err("bench collective: --reps must be 1..%d", BC_MAX_REPS);
                bad = true;
            }
            o->bo_reps = (unsigned)u;
        } else if (tool_opt_value(argc, argv, &i, "--engine", &v, &bad)) {
            if (!bad && strcmp(v, "auto") != 0 && strcmp(v, "shm") != 0 &&
                strcmp(v, "pipe") != 0) {
                tool_err("bench collective: unknown engine \"%s\" (auto, "
                         "shm, pipe)",
                         v);
                bad = true;
            }
            o->bo_engine = v;
        } else if (tool_opt_value(argc, argv, &i, "--store", &v, &bad)) {
            if (!bad && strcmp(v, "file") != 0 && strcmp(v, "tcp") != 0) {
                tool_err("bench collective: unknown store \"%s\" (file, tcp)",
                         v);
                bad = true;
            }
            o->bo_tcp = !bad && strcmp(v, "tcp") == 0;
        } else if (tool_opt_value(argc, argv, &i, "--budget", &v, &bad)) {
            if (!bad && (!tool_parse_double(v, &o->bo_budget) ||
                         o->bo_budget <= 0 || o->bo_budget > 3600)) {
                tool_err("bench collective: bad --budget \"%s\"", v);
                bad = true;
            }
        } else if (tool_opt_value(argc, argv, &i, "--timeout", &v, &bad)) {
            if (!bad && (!tool_parse_double(v, &o->bo_timeout_s) ||
                         o->bo_timeout_s < 1 || o->bo_timeout_s > 86400)) {
                tool_err("bench collective: bad --timeout \"%s\" (1..86400 "
                         "seconds)",
                         v);
                bad = true;
            }
        } else {
            tool_err("bench collective: unknown option \"%s\"", a);
            bad = true;
        }
        if (bad) {
            bc_usage(stderr);
            return TOOL_EXIT_USAGE;
        }
    }
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
static size_t
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

static void
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

// ---- a rank ----------------------------------------------------------------

typedef struct bc_rank {
    const bc_opts *r_opts;
    int r_rank, r_world, r_fd;
    tp_pg *r_pg;
    tp_tensor *r_in, *r_out; // the op's buffers (NULL where unused)
    tp_tensor *r_time;       // f64 [1]: batch times, reduced with max
    tp_tensor *r_flag;       // i32 [1]: a wrong result somewhere
} bc_rank;

// Sends "<rank> <message>\n" to this process in one write (atomic).
static void bc_send(const bc_rank *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void
bc_send(const bc_rank *r, const char *fmt, ...)
{
    char line[BC_LINE_MAX];
    int n = snprintf(line, sizeof(line), "%d ", r->r_rank);
    va_list ap;
    va_start(ap, fmt);
    size_t cap = sizeof(line) - (size_t)n - 1; // the newline's byte spared
    int m = vsnprintf(line + n, cap, fmt, ap);
    va_end(ap);
    // Truncated: vsnprintf wrote cap - 1 bytes and a NUL.
    size_t len = (size_t)n + (m < 0             ? 0
                              : (size_t)m < cap ? (size_t)m
                                                : cap - 1);
    // Errors carry library messages: keep them on one line.
    for (size_t i = (size_t)n; i < len; i++) {
        if (line[i] == '\n') {
            line[i] = ' ';
        }
    }
    line[len++] = '\n';
    if (write(r->r_fd, line, len) < 0) {
        // This process is gone; the rank dies with it (PR_SET_PDEATHSIG).
    }
}

// Reports "error <what>: <message> (<status>)", drops @err and exits.
static void __attribute__((noreturn))
bc_rank_fail(bc_rank *r, const char *what, tp_status st, tp_error *err)
{
    bc_send(r, "error %s: %s (%s)", what,
            err != NULL ? tp_error_message(err) : "no error message",
            tp_status_name(st));
    tp_error_unref(err);
    _exit(TOOL_EXIT_FAIL);
}

static void
bc_set(tp_tensor *t, uint64_t i, double v)
{
    void *p = tp_tensor_data(t);
    switch (tp_tensor_dtype(t)) {
    case TP_F32:
        ((float *)p)[i] = (float)v;
        break;
    case TP_F64:
        ((double *)p)[i] = v;
        break;
    case TP_I32:
        ((int32_t *)p)[i] = (int32_t)v;
        break;
    default:
        ((int64_t *)p)[i] = (int64_t)v;
        break;
    }
}

static double
bc_get(const tp_tensor *t, uint64_t i)
{
    const void *p = tp_tensor_data(t);
    switch (tp_tensor_dtype(t)) {
    case TP_F32:
        return ((const float *)p)[i];
    case TP_F64:
        return ((const double *)p)[i];
    case TP_I32:
        return ((const int32_t *)p)[i];
    default:
        return (double)((const int64_t *)p)[i];
    }
}

// Inputs of the check: small integers, exact in every dtype (also their
// sums over 64 ranks).
// all_reduce, reduce, reduce_scatter: rank r's element i.
static double
bc_val_sum(int r, uint64_t i)
{
    return (double)(r + 1) + (double)(i % 7);
}

// The sum of bc_val_sum over @n ranks.
static double
bc_val_sum_all(int n, uint64_t i)
{
    return (double)n * (n + 1) / 2 + (double)n * (double)(i % 7);
}

// all_gather, gather, scatter: element i of rank r's block.
static double
bc_val_block(int r, uint64_t i)
{
    return (double)r * 1000 + (double)(i % 997);
}

// all_to_all: element i of the block rank @src sends to rank @dst.
static double
bc_val_a2a(int src, int dst, uint64_t i)
{
    return ((double)src * BC_MAX_WORLD + dst) * 8 + (double)(i % 8);
}

// broadcast: the root's element i (the others start at -1).
static double
bc_val_bcast(uint64_t i)
{
    return (double)(i % 1009) + 1;
}

// Fills the buffers with the check's inputs.
static void
bc_fill_check(bc_rank *r, const bc_cell *c)
{
    int me = r->r_rank;
    switch (c->c_kind) {
    case BC_ALL_REDUCE:
    case BC_REDUCE:
    case BC_REDUCE_SCATTER:
        for (uint64_t i = 0; i < c->c_count; i++) {
            bc_set(r->r_in, i, bc_val_sum(me, i));
        }
        break;
    case BC_BROADCAST:
        for (uint64_t i = 0; i < c->c_count; i++) {
            bc_set(r->r_in, i, me == 0 ? bc_val_bcast(i) : -1);
        }
        break;
    case BC_ALL_GATHER:
    case BC_GATHER:
        for (uint64_t i = 0; i < c->c_block; i++) {
            bc_set(r->r_in, i, bc_val_block(me, i));
        }
        break;
    case BC_SCATTER:
        for (uint64_t i = 0; r->r_in != NULL && i < c->c_count; i++) {
            bc_set(r->r_in, i,
                   bc_val_block((int)(i / c->c_block), i % c->c_block));
        }
        break;
    case BC_ALL_TO_ALL:
        for (uint64_t i = 0; i < c->c_count; i++) {
            bc_set(r->r_in, i,
                   bc_val_a2a(me, (int)(i / c->c_block), i % c->c_block));
        }
        break;
    default:
        break;
    }
}

// Compares @t's element @i with @want; on a mismatch writes it to @why.
static bool
bc_expect(const tp_tensor *t, const char *name, uint64_t i, double want,
          char *why, size_t len)
{
    double got = bc_get(t, i);
    if (got == want) {
        return true;
    }
    snprintf(why, len, "wrong result: %s[%llu] = %.17g, want %.17g", name,
             (unsigned long long)i, got, want);
    return false;
}

// Checks the result of the op on the check's inputs. False with the first
// wrong element in @why.
static bool
bc_verify(const bc_rank *r, const bc_cell *c, char *why, size_t len)
{
    int me = r->r_rank, n = r->r_world;
    bool ok = true;
    switch (c->c_kind) {
    case BC_ALL_REDUCE:
        for (uint64_t i = 0; ok && i < c->c_count; i++) {
            ok =
                bc_expect(r->r_in, "buffer", i, bc_val_sum_all(n, i), why, len);
        }
        break;
    case BC_REDUCE:
        // The root holds the sum; the others' buffers are unchanged.
        for (uint64_t i = 0; ok && i < c->c_count; i++) {
            ok = bc_expect(r->r_in, "buffer", i,
                           me == 0 ? bc_val_sum_all(n, i) : bc_val_sum(me, i),
                           why, len);
        }
        break;
    case BC_REDUCE_SCATTER:
        for (uint64_t i = 0; ok && i < c->c_block; i++) {
            uint64_t j = (uint64_t)me * c->c_block + i;
            ok = bc_expect(r->r_out, "output", i, bc_val_sum_all(n, j), why,
                           len);
        }
        break;
    case BC_BROADCAST:
        for (uint64_t i = 0; ok && i < c->c_count; i++) {
            ok = bc_expect(r->r_in, "buffer", i, bc_val_bcast(i), why, len);
        }
        break;
    case BC_ALL_GATHER:
    case BC_GATHER:
        for (uint64_t i = 0; r->r_out != NULL && ok && i < c->c_count; i++) {
            ok = bc_expect(r->r_out, "output", i,
                           bc_val_block((int)(i / c->c_block), i % c->c_block),
                           why, len);
        }
        break;
    case BC_SCATTER:
        for (uint64_t i = 0; ok && i < c->c_block; i++) {
            ok =
                bc_expect(r->r_out, "output", i, bc_val_block(me, i), why, len);
        }
        break;
    case BC_ALL_TO_ALL:
        for (uint64_t i = 0; ok && i < c->c_count; i++) {
            ok =
                bc_expect(r->r_out, "output", i,
                          bc_val_a2a((int)(i / c->c_block), me, i % c->c_block),
                          why, len);
        }
        break;
    default:
        break;
    }
    return ok;
}

// One blocking call of the cell's op.
static tp_status
bc_call(bc_rank *r, const bc_cell *c, tp_error **err_p)
{
    tp_pg *pg = r->r_pg;
    switch (c->c_kind) {
    case BC_ALL_REDUCE:
        return tp_pg_all_reduce(pg, r->r_in, TP_REDUCE_SUM, NULL, err_p);
    case BC_ALL_GATHER:
        return tp_pg_all_gather(pg, r->r_out, r->r_in, NULL, err_p);
    case BC_REDUCE_SCATTER:
        return tp_pg_reduce_scatter(pg, r->r_out, r->r_in, TP_REDUCE_SUM, NULL,
                                    err_p);
    case BC_BROADCAST:
        return tp_pg_broadcast(pg, r->r_in, 0, NULL, err_p);
    case BC_REDUCE:
        return tp_pg_reduce(pg, r->r_in, 0, TP_REDUCE_SUM, NULL, err_p);
    case BC_ALL_TO_ALL:
        return tp_pg_all_to_all(pg, r->r_out, r->r_in, NULL, NULL, NULL, err_p);
    case BC_BARRIER:
        return tp_pg_barrier(pg, NULL, err_p);
    case BC_GATHER:
        return tp_pg_gather(pg, r->r_out, r->r_in, 0, NULL, err_p);
    case BC_SCATTER:
        return tp_pg_scatter(pg, r->r_out, r->r_in, 0, NULL, err_p);
    default:
        break;
    }
    return TP_EINVAL;
}

static tp_tensor *
bc_tensor(bc_rank *r, const bc_cell *c, uint64_t count)
{
    int64_t shape[1] = {(int64_t)count};
    tp_tensor *t = NULL;
    tp_error *err = NULL;
    tp_status st = tp_tensor_empty(r->r_opts->bo_dtype, 1, shape, &t, &err);
    if (st != TP_OK) {
        char what[160], name[96];
        bc_cell_name(c, name, sizeof(name));
        snprintf(what, sizeof(what), "%s: tp_tensor_empty(%llu elements)", name,
                 (unsigned long long)count);
        bc_rank_fail(r, what, st, err);
    }
    return t;
}

// The cell's buffers (see bc_usage for what size means per op).
static void
bc_alloc(bc_rank *r, const bc_cell *c)
{
    bool root = r->r_rank == 0;
    r->r_in = r->r_out = NULL;
    switch (c->c_kind) {
    case BC_ALL_REDUCE:
    case BC_BROADCAST:
    case BC_REDUCE:
        r->r_in = bc_tensor(r, c, c->c_count);
        break;
    case BC_ALL_GATHER:
        r->r_in = bc_tensor(r, c, c->c_block);
        r->r_out = bc_tensor(r, c, c->c_count);
        break;
    case BC_REDUCE_SCATTER:
        r->r_in = bc_tensor(r, c, c->c_count);
        r->r_out = bc_tensor(r, c, c->c_block);
        break;
    case BC_ALL_TO_ALL:
        r->r_in = bc_tensor(r, c, c->c_count);
        r->r_out = bc_tensor(r, c, c->c_count);
        break;
    case BC_GATHER:
        r->r_in = bc_tensor(r, c, c->c_block);
        r->r_out = root ? bc_tensor(r, c, c->c_count) : NULL;
        break;
    case BC_SCATTER:
        r->r_in = root ? bc_tensor(r, c, c->c_count) : NULL;
        r->r_out = bc_tensor(r, c, c->c_block);
        break;
    default:
        break;
    }
}

static void
bc_zero(tp_tensor *t)
{
    if (t != NULL) {
        memset(tp_tensor_data(t), 0, tp_tensor_nbytes(t));
    }
}

// Runs @n calls; on failure reports "<cell>: <phase>: <call>" and exits.
static void
bc_calls(bc_rank *r, const bc_cell *c, uint64_t n, const char *phase)
{
    for (uint64_t i = 0; i < n; i++) {
        tp_error *err = NULL;
        tp_status st = bc_call(r, c, &err);
        if (st != TP_OK) {
            char what[256], name[96];
            bc_cell_name(c, name, sizeof(name));
            snprintf(what, sizeof(what), "%s: %s: call %llu of %llu: %s", name,
                     phase, (unsigned long long)i + 1, (unsigned long long)n,
                     bc_ops[c->c_kind].op_call);
            bc_rank_fail(r, what, st, err);
        }
    }
}

// The max over ranks of @v (every rank gets it).
static double
bc_max_all(bc_rank *r, const bc_cell *c, double v, const char *phase)
{
    *(double *)tp_tensor_data(r->r_time) = v;
    tp_error *err = NULL;
    tp_status st =
        tp_pg_all_reduce(r->r_pg, r->r_time, TP_REDUCE_MAX, NULL, &err);
    if (st != TP_OK) {
        char what[256], name[96];
        bc_cell_name(c, name, sizeof(name));
        snprintf(what, sizeof(what), "%s: %s: tp_pg_all_reduce(max)", name,
                 phase);
        bc_rank_fail(r, what, st, err);
    }
    return *(double *)tp_tensor_data(r->r_time);
}

// Step 1: the op once on known inputs, checked on every rank.
static void
bc_check(bc_rank *r, const bc_cell *c)
{
    char why[256] = "", name[96];
    bc_cell_name(c, name, sizeof(name));
    bc_fill_check(r, c);
    bc_calls(r, c, 1, "check");
    bool ok = bc_verify(r, c, why, sizeof(why));
    *(int32_t *)tp_tensor_data(r->r_flag) = ok ? 0 : 1;
    tp_error *err = NULL;
    tp_status st =
        tp_pg_all_reduce(r->r_pg, r->r_flag, TP_REDUCE_MAX, NULL, &err);
    if (st != TP_OK) {
        char what[256];
        snprintf(what, sizeof(what), "%s: check: tp_pg_all_reduce(max)", name);
        bc_rank_fail(r, what, st, err);
    }
    if (!ok) {
        bc_send(r, "error %s: check: %s", name, why);
        _exit(TOOL_EXIT_FAIL);
    }
    if (*(int32_t *)tp_tensor_data(r->r_flag) != 0) {
        // Another rank saw a wrong value and says which.
        bc_send(r, "abort");
        _exit(TOOL_EXIT_FAIL);
    }
}

// Step 3: doubles a batch until it takes budget / 20, then sizes the
// measurement to the budget. Every rank takes the same decisions (the
// batch time is the max over ranks).
static uint64_t
bc_calibrate(bc_rank *r, const bc_cell *c)
{
    double budget = r->r_opts->bo_budget;
    uint64_t k = 1;
    double per = 0;
    for (;;) {
        uint64_t t0 = tp__now_ns();
        bc_calls(r, c, k, "calibration");
        double dt = (double)(tp__now_ns() - t0) / 1e9;
        dt = bc_max_all(r, c, dt, "calibration");
        per = dt / (double)k;
        if (dt >= budget / 20 || k >= BC_MAX_ITERS / 2) {
            break;
        }
        k *= 2;
    }
    double n = per > 0 ? budget / per : (double)BC_MAX_ITERS;
    if (n < BC_MIN_ITERS) {
        n = BC_MIN_ITERS;
    }
    if (n > BC_MAX_ITERS) {
        n = BC_MAX_ITERS;
    }
    return (uint64_t)n;
}

static void
bc_measure(bc_rank *r, const bc_cell *c, size_t idx)
{
    const bc_opts *o = r->r_opts;
    char name[96];
    bc_cell_name(c, name, sizeof(name));
    bc_alloc(r, c);
    bc_check(r, c);
    bc_zero(r->r_in);
    bc_zero(r->r_out);
    bc_calls(r, c, o->bo_warmup, "warm-up");
    uint64_t iters = o->bo_iters ? o->bo_iters : bc_calibrate(r, c);

    tp_error *err = NULL;
    tp_status st = tp_pg_barrier(r->r_pg, NULL, &err);
    if (st != TP_OK) {
        char what[160];
        snprintf(what, sizeof(what), "%s: tp_pg_barrier before the timed calls",
                 name);
        bc_rank_fail(r, what, st, err);
    }
    uint64_t t0 = tp__now_ns();
    bc_calls(r, c, iters, "timed");
    double us = (double)(tp__now_ns() - t0) / 1e3 / (double)iters;

    // The slowest rank's mean, to rank 0.
    *(double *)tp_tensor_data(r->r_time) = us;
    st = tp_pg_reduce(r->r_pg, r->r_time, 0, TP_REDUCE_MAX, NULL, &err);
    if (st != TP_OK) {
        char what[160];
        snprintf(what, sizeof(what), "%s: tp_pg_reduce(max) of the times",
                 name);
        bc_rank_fail(r, what, st, err);
    }
    if (r->r_rank == 0) {
        bc_send(r, "result %zu %.6g %llu", idx,
                *(double *)tp_tensor_data(r->r_time),
                (unsigned long long)iters);
    }
    tp_tensor_unref(r->r_in);
    tp_tensor_unref(r->r_out);
    r->r_in = r->r_out = NULL;
}

// A rank's life: join, measure every cell, report "done". Never returns.
static void __attribute__((noreturn))
bc_rank_main(const bc_opts *o, const bc_cell *cells, size_t ncells, int rank,
             const char *url, int fd)
{
    bc_rank r = {
        .r_opts = o, .r_rank = rank, .r_world = o->bo_world, .r_fd = fd};
    if (strcmp(o->bo_engine, "auto") != 0) {
        setenv("TP_COLL_ENGINE", o->bo_engine, 1);
    }
    // Rank r on CPU r mod the CPUs this process may use, as mpirun binds
    // by default: two ranks that land on one CPU hand every phase over
    // through the scheduler, and the numbers then depend on placement.
    if (!o->bo_no_bind) {
        cpu_set_t allowed, one;
        if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0 &&
            CPU_COUNT(&allowed) > 0) {
            int want = rank % CPU_COUNT(&allowed), seen = 0;
            for (int c = 0; c < CPU_SETSIZE; c++) {
                if (CPU_ISSET(c, &allowed) && seen++ == want) {
                    CPU_ZERO(&one);
                    CPU_SET(c, &one);
                    (void)sched_setaffinity(0, sizeof(one), &one);
                    break;
                }
            }
        }
    }
    // Every rank is on this host: its pipes stay on loopback (unless the
    // user chose an interface or address).
    if (getenv("TP_SOCKET_ADDR") == NULL) {
        setenv("TP_SOCKET_IFNAME", "lo", 0);
    }
    tp_pg_options po;
    tp_pg_options_init(&po);
    int64_t limit_ms = (int64_t)(o->bo_timeout_s * 1000);
    po.timeout_ms = limit_ms;
    po.init_timeout_ms = limit_ms < 60000 ? limit_ms : 60000;
    tp_error *err = NULL;
    tp_status st = tp_pg_init(url, rank, o->bo_world, &po, &r.r_pg, &err);
    if (st != TP_OK) {
        char what[700];
        snprintf(what, sizeof(what), "tp_pg_init(%s, rank %d of %d)", url, rank,
                 o->bo_world);
        bc_rank_fail(&r, what, st, err);
    }
    const char *engine = tp_pg_engine(r.r_pg);
    if (strcmp(o->bo_engine, "auto") != 0 &&
        strcmp(engine, o->bo_engine) != 0) {
        bc_send(&r,
                "error asked for engine %s (TP_COLL_ENGINE) but the group "
                "runs on %s",
                o->bo_engine, engine);
        _exit(TOOL_EXIT_FAIL);
    }
    if (rank == 0) {
        bc_send(&r, "engine %s", engine);
    }
    int64_t one[1] = {1};
    if ((st = tp_tensor_empty(TP_F64, 1, one, &r.r_time, &err)) != TP_OK ||
        (st = tp_tensor_empty(TP_I32, 1, one, &r.r_flag, &err)) != TP_OK) {
        bc_rank_fail(&r, "tp_tensor_empty", st, err);
    }
    for (size_t i = 0; i < ncells; i++) {
        bc_measure(&r, &cells[i], i);
    }
    tp_tensor_unref(r.r_time);
    tp_tensor_unref(r.r_flag);
    tp_pg_destroy(r.r_pg);
    bc_send(&r, "done");
    _exit(TOOL_EXIT_OK);
}

// ---- this process: the repetitions ---------------------------------------

// Results of all repetitions: [cell][rep].
typedef struct bc_results {
    size_t rs_ncells;
    unsigned rs_reps;
    double *rs_time; // us
    double *rs_iters;
    char rs_engine[16];
} bc_results;

// Removes the store's temporary directory and what the store left in it.
static void
bc_rmdir(const char *dir)
{
    DIR *d = opendir(dir);
    if (d != NULL) {
        for (struct dirent *e = readdir(d); e != NULL; e = readdir(d)) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) {
                continue;
            }
            char p[512];
            snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(dir);
}

// The state of one repetition in this process.
typedef struct bc_rep {
    const bc_opts *rp_opts;
    const bc_cell *rp_cells;
    size_t rp_ncells;
    unsigned rp_rep;
    bc_results *rp_res;
    pid_t rp_pid[BC_MAX_WORLD];
    bool rp_done[BC_MAX_WORLD]; // said "done"
    int rp_ndone;
    size_t rp_nresults;
    char rp_err[4096]; // every rank's error, "; "-separated
    bool rp_failed;
    char rp_buf[8192];
    size_t rp_len;
} bc_rep;

static void bc_rep_err(bc_rep *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void
bc_rep_err(bc_rep *p, const char *fmt, ...)
{
    size_t off = strlen(p->rp_err);
    if (off > 0 && off + 2 < sizeof(p->rp_err)) {
        memcpy(p->rp_err + off, "; ", 3);
        off += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    if (off < sizeof(p->rp_err)) {
        vsnprintf(p->rp_err + off, sizeof(p->rp_err) - off, fmt, ap);
    }
    va_end(ap);
    p->rp_failed = true;
}

// One line from a rank: "<rank> engine|result|error|abort|done ...".
static void
bc_rep_line(bc_rep *p, char *line)
{
    const bc_opts *o = p->rp_opts;
    char *rest = NULL;
    long rank = strtol(line, &rest, 10);
    if (rest == line || *rest != ' ' || rank < 0 || rank >= o->bo_world) {
        bc_rep_err(p, "a rank sent a malformed line \"%.200s\"", line);
        return;
    }
    rest++;
    if (strncmp(rest, "engine ", 7) == 0) {
        snprintf(p->rp_res->rs_engine, sizeof(p->rp_res->rs_engine), "%s",
                 rest + 7);
        tool_verbose(o->bo_verbose, "bench collective",
                     "repetition %u: engine %s", p->rp_rep + 1, rest + 7);
    } else if (strncmp(rest, "result ", 7) == 0) {
        char *end = NULL;
        unsigned long long idx = strtoull(rest + 7, &end, 10);
        double us = strtod(end, &end);
        double iters = strtod(end, NULL);
        if (idx >= p->rp_ncells || !(us > 0)) {
            bc_rep_err(p, "rank 0 sent a malformed result \"%.200s\"", rest);
            return;
        }
        size_t k = (size_t)idx * p->rp_res->rs_reps + p->rp_rep;
        p->rp_res->rs_time[k] = us;
        p->rp_res->rs_iters[k] = iters;
        p->rp_nresults++;
        char name[96];
        bc_cell_name(&p->rp_cells[idx], name, sizeof(name));
        tool_verbose(o->bo_verbose, "bench collective",
                     "repetition %u: %s: %.2f us per call (%.0f calls)",
                     p->rp_rep + 1, name, us, iters);
    } else if (strncmp(rest, "error ", 6) == 0) {
        bc_rep_err(p, "rank %ld: %s", rank, rest + 6);
    } else if (strcmp(rest, "abort") == 0) {
        p->rp_failed = true; // the rank that saw the wrong value says it
    } else if (strcmp(rest, "done") == 0) {
        if (!p->rp_done[rank]) {
            p->rp_done[rank] = true;
            p->rp_ndone++;
        }
    } else {
        bc_rep_err(p, "rank %ld sent an unknown line \"%.200s\"", rank, rest);
    }
}

// Reads the ranks' lines until every write end closed, the deadline, or
// a little after the first error. False when the deadline passed.
static bool
bc_rep_read(bc_rep *p, int fd, uint64_t deadline)
{
    uint64_t fail_deadline = UINT64_MAX;
    for (;;) {
        uint64_t now = tp__now_ns();
        if (p->rp_failed && fail_deadline == UINT64_MAX) {
            fail_deadline = now + (uint64_t)(BC_ERROR_GRACE_S * 1e9);
        }
        uint64_t dl = deadline < fail_deadline ? deadline : fail_deadline;
        if (now >= dl) {
            return now < deadline;
        }
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int ms = (int)((dl - now) / 1000000u) + 1;
        int pr = poll(&pfd, 1, ms > 200 ? 200 : ms);
        if (pr < 0 && errno != EINTR) {
            bc_rep_err(p, "poll: %s", strerror(errno));
            return true;
        }
        if (pr <= 0) {
            continue;
        }
        ssize_t n =
            read(fd, p->rp_buf + p->rp_len, sizeof(p->rp_buf) - 1 - p->rp_len);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            return true; // every rank closed its end
        }
        p->rp_len += (size_t)n;
        p->rp_buf[p->rp_len] = '\0';
        char *start = p->rp_buf, *nl;
        while ((nl = strchr(start, '\n')) != NULL) {
            *nl = '\0';
            bc_rep_line(p, start);
            start = nl + 1;
        }
        p->rp_len -= (size_t)(start - p->rp_buf);
        memmove(p->rp_buf, start, p->rp_len);
        if (p->rp_len == sizeof(p->rp_buf) - 1) {
            p->rp_len = 0; // a line longer than any rank writes
        }
    }
}

// One repetition: fresh ranks. False after writing what failed to
// p->rp_err.
static bool
bc_run_rep(bc_rep *p)
{
    const bc_opts *o = p->rp_opts;
    char url[600], dir[256] = "";
    if (o->bo_tcp) {
        char why[256];
        int port = tool_free_port(why, sizeof(why));
        if (port < 0) {
            bc_rep_err(p, "%s", why);
            return false;
        }
        snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", port);
    } else {
        const char *tmp = getenv("TMPDIR");
        snprintf(dir, sizeof(dir), "%s/tpipe-bench-coll-XXXXXX",
                 tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp");
        if (mkdtemp(dir) == NULL) {
            bc_rep_err(p, "mkdtemp(%s): %s", dir, strerror(errno));
            return false;
        }
        snprintf(url, sizeof(url), "file://%s/store", dir);
    }
    int pfd[2];
    if (pipe(pfd) != 0) {
        bc_rep_err(p, "pipe: %s", strerror(errno));
        if (dir[0] != '\0') {
            bc_rmdir(dir);
        }
        return false;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t parent = getpid();
    int started = 0;
    for (int rank = 0; rank < o->bo_world; rank++) {
        pid_t pid = fork();
        if (pid < 0) {
            bc_rep_err(p, "fork of rank %d: %s", rank, strerror(errno));
            break;
        }
        if (pid == 0) {
            close(pfd[0]);
            // Die with this process, whatever happens to it.
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent) {
                _exit(TOOL_EXIT_FAIL);
            }
            bc_rank_main(o, p->rp_cells, p->rp_ncells, rank, url, pfd[1]);
        }
        p->rp_pid[started++] = pid;
    }
    close(pfd[1]);
    bool in_time = true;
    if (!p->rp_failed) {
        uint64_t deadline = tp__now_ns() + (uint64_t)(o->bo_timeout_s * 1e9);
        in_time = bc_rep_read(p, pfd[0], deadline);
    }
    close(pfd[0]);
    bool ok = !p->rp_failed && in_time && p->rp_ndone == o->bo_world &&
              p->rp_nresults == p->rp_ncells;
    if (!in_time) {
        char last[128] = "none";
        for (size_t i = p->rp_ncells; i-- > 0;) {
            if (!isnan(
                    p->rp_res->rs_time[i * p->rp_res->rs_reps + p->rp_rep])) {
                bc_cell_name(&p->rp_cells[i], last, sizeof(last));
                break;
            }
        }
        char pending[256] = "";
        size_t off = 0;
        for (int r = 0; r < started && off < sizeof(pending); r++) {
            if (!p->rp_done[r]) {
                off += (size_t)snprintf(pending + off, sizeof(pending) - off,
                                        "%s%d", off ? ", " : "", r);
            }
        }
        bc_rep_err(p,
                   "did not finish within --timeout %g s (last measurement "
                   "reported: %s; ranks not done: %s); killed the ranks",
                   o->bo_timeout_s, last, pending[0] ? pending : "none");
    }
    // Reap every rank; one that failed without saying why is reported, and
    // one that died of a signal before we killed the rest (a crash, the
    // OOM killer) always is: the others' errors are then its consequence.
    for (int r = 0; r < started; r++) {
        int status = -1;
        bool dead = waitpid(p->rp_pid[r], &status, WNOHANG) == p->rp_pid[r];
        if (!dead) {
            status = tool_reap(p->rp_pid[r], ok ? 5000 : 0, !ok);
        }
        bool exited0 =
            status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (ok && !exited0) {
            ok = false;
        }
        if (dead && WIFSIGNALED(status)) {
            bc_rep_err(p, "rank %d (pid %d) died of signal %d (%s)", r,
                       (int)p->rp_pid[r], WTERMSIG(status),
                       strsignal(WTERMSIG(status)));
        } else if (!exited0 && !p->rp_failed) {
            if (status != -1 && WIFSIGNALED(status)) {
                bc_rep_err(p, "rank %d (pid %d) killed by signal %d", r,
                           (int)p->rp_pid[r], WTERMSIG(status));
            } else {
                bc_rep_err(p, "rank %d (pid %d) exited with status %d", r,
                           (int)p->rp_pid[r],
                           status == -1 ? -1 : WEXITSTATUS(status));
            }
        }
    }
    if (ok && p->rp_nresults != p->rp_ncells) {
        ok = false;
    }
    if (!ok && p->rp_err[0] == '\0') {
        bc_rep_err(p,
                   "the ranks ended after %zu of %zu measurements without "
                   "an error message",
                   p->rp_nresults, p->rp_ncells);
    }
    if (dir[0] != '\0') {
        bc_rmdir(dir);
    }
    return ok;
}

// ---- output ----------------------------------------------------------------

// A cell's numbers over the repetitions.
typedef struct bc_row {
    double rw_time, rw_min, rw_max, rw_iters;
    double rw_algbw, rw_busbw, rw_factor;
} bc_row;

static void
bc_row_of(const bc_opts *o, const bc_results *res, const bc_cell *c, size_t idx,
          bc_row *w)
{
    double t[BC_MAX_REPS], it[BC_MAX_REPS];
    unsigned n = res->rs_reps;
    for (unsigned i = 0; i < n; i++) {
        t[i] = res->rs_time[idx * n + i];
        it[i] = res->rs_iters[idx * n + i];
    }
    w->rw_time = tool_median(t, n); // sorts t
    w->rw_min = t[0];
    w->rw_max = t[n - 1];
    w->rw_iters = tool_median(it, n);
    w->rw_factor = bc_bus_factor(c->c_kind, o->bo_world);
    // GB/s = 1e9 B/s; bytes / us / 1e3.
    w->rw_algbw = (double)c->c_size / w->rw_time / 1e3;
    w->rw_busbw = w->rw_algbw * w->rw_factor;
}

static void
bc_json_num(const char *name, double v)
{
    printf(",\"%s\":", name);
    tool_json_num(stdout, v);
}

static void
bc_print(const bc_opts *o, const bc_results *res, const bc_cell *cells,
         size_t ncells)
{
    const char *dt = tp_dtype_name(o->bo_dtype);
    const char *engine = res->rs_engine[0] ? res->rs_engine : "?";
    if (o->bo_json) {
        for (size_t i = 0; i < ncells; i++) {
            const bc_cell *c = &cells[i];
            bc_row w;
            bc_row_of(o, res, c, i, &w);
            printf("{\"bench\":\"collective\",\"op\":\"%s\",\"size\":%llu,"
                   "\"count\":%llu,\"dtype\":",
                   bc_ops[c->c_kind].op_name, (unsigned long long)c->c_size,
                   (unsigned long long)c->c_count);
            if (c->c_kind == BC_BARRIER) {
                printf("null");
            } else {
                tool_json_str(stdout, dt);
            }
            printf(",\"world\":%d,\"engine\":", o->bo_world);
            tool_json_str(stdout, engine);
            bc_json_num("time_us", w.rw_time);
            bc_json_num("algbw_gbps", w.rw_algbw);
            bc_json_num("busbw_gbps", w.rw_busbw);
            bc_json_num("busbw_factor", w.rw_factor);
            printf(",\"iters\":%.0f,\"warmup\":%u", w.rw_iters, o->bo_warmup);
            bc_json_num("time_min_us", w.rw_min);
            bc_json_num("time_max_us", w.rw_max);
            printf(",\"reps\":%u}\n", res->rs_reps);
        }
        fflush(stdout);
        return;
    }
    printf("# tpipe bench collective: world %d, engine %s, median of %u "
           "repetition%s\n",
           o->bo_world, engine, res->rs_reps, res->rs_reps == 1 ? "" : "s");
    printf("# time_us: mean per call, max over ranks; algbw, busbw: GB/s "
           "(1e9 B/s); size: bytes\n");
    tool_table tab;
    tool_table_init(&tab, 9);
    for (size_t k = 1; k < 9; k++) {
        tab.tt_right[k] = k != 3 && k != 4;
    }
    static const char *const head[] = {"op",      "size",   "count",
                                       "dtype",   "engine", "iters",
                                       "time_us", "algbw",  "busbw"};
    tool_table_add(&tab, head);
    for (size_t i = 0; i < ncells; i++) {
        const bc_cell *c = &cells[i];
        bc_row w;
        bc_row_of(o, res, c, i, &w);
        char sz[32], cnt[32], it[32], t[32], ab[32], bb[32];
        snprintf(sz, sizeof(sz), "%llu", (unsigned long long)c->c_size);
        snprintf(cnt, sizeof(cnt), "%llu", (unsigned long long)c->c_count);
        snprintf(it, sizeof(it), "%.0f", w.rw_iters);
        tool_fmt_num(t, sizeof(t), w.rw_time, w.rw_time < 100 ? 2 : 1);
        tool_fmt_num(ab, sizeof(ab), w.rw_algbw, 3);
        tool_fmt_num(bb, sizeof(bb), w.rw_busbw, 3);
        const char *cells_row[] = {bc_ops[c->c_kind].op_name,
                                   sz,
                                   cnt,
                                   c->c_kind == BC_BARRIER ? "-" : dt,
                                   engine,
                                   it,
                                   t,
                                   ab,
                                   bb};
        tool_table_add(&tab, cells_row);
    }
    tool_table_print(&tab, stdout);
    tool_table_fini(&tab);
    fflush(stdout);
}

// --plot FILE: FILE.dat (one block per op: size busbw algbw time_us,
// blocks separated by two blank lines) and FILE, a gnuplot script with the
// same data inline that writes an SVG of busbw against size (log2 x).
static bool
bc_plot(const bc_opts *o, const bc_results *res, const bc_cell *cells,
        size_t ncells)
{
    const char *file = o->bo_plot;
    char dat[1024], svg[1024];
    snprintf(dat, sizeof(dat), "%s.dat", file);
    size_t len = strlen(file);
    if (len > 3 && strcmp(file + len - 3, ".gp") == 0) {
        snprintf(svg, sizeof(svg), "%.*s.svg", (int)(len - 3), file);
    } else {
        snprintf(svg, sizeof(svg), "%s.svg", file);
    }
    FILE *fd = fopen(dat, "w");
    FILE *fg = fd != NULL ? fopen(file, "w") : NULL;
    if (fg == NULL) {
        tool_err("bench collective: --plot: cannot write %s: %s",
                 fd == NULL ? dat : file, strerror(errno));
        if (fd != NULL) {
            fclose(fd);
        }
        return false;
    }
    fprintf(fg,
            "# tpipe bench collective: busbw against size, world %d, "
            "engine %s, dtype %s.\n"
            "# Run `gnuplot %s`; it writes %s. The same data: %s.\n"
            "set terminal svg size 800,500 dynamic\n"
            "set output \"%s\"\n"
            "set title \"tpipe bench collective (world %d, engine %s)\"\n"
            "set xlabel \"size (bytes)\"\n"
            "set ylabel \"busbw (GB/s)\"\n"
            "set logscale x 2\n"
            "set format x \"%%.0b%%B\"\n"
            "set key top left\n"
            "set grid\n",
            o->bo_world, res->rs_engine, tp_dtype_name(o->bo_dtype), file, svg,
            dat, svg, o->bo_world, res->rs_engine);
    fprintf(fd,
            "# tpipe bench collective, world %d, engine %s, dtype %s\n"
            "# one block per op; columns: size_bytes busbw_gbps "
            "algbw_gbps time_us\n",
            o->bo_world, res->rs_engine, tp_dtype_name(o->bo_dtype));
    size_t nblocks = 0;
    char plot[2048] = "";
    size_t poff = 0;
    for (size_t j = 0; j < o->bo_nops; j++) {
        bc_kind k = o->bo_ops[j];
        if (k == BC_BARRIER) {
            continue; // no bytes: nothing to plot
        }
        const char *name = bc_ops[k].op_name;
        fprintf(fd, "%s# %s\n", nblocks ? "\n\n" : "", name);
        fprintf(fg, "$%s << EOD\n", name);
        for (size_t i = 0; i < ncells; i++) {
            if (cells[i].c_kind != k) {
                continue;
            }
            bc_row w;
            bc_row_of(o, res, &cells[i], i, &w);
            fprintf(fd, "%llu %.6g %.6g %.6g\n",
                    (unsigned long long)cells[i].c_size, w.rw_busbw, w.rw_algbw,
                    w.rw_time);
            fprintf(fg, "%llu %.6g\n", (unsigned long long)cells[i].c_size,
                    w.rw_busbw);
        }
        fprintf(fg, "EOD\n");
        if (poff < sizeof(plot)) {
            poff +=
                (size_t)snprintf(plot + poff, sizeof(plot) - poff,
                                 "%s$%s using 1:2 with linespoints title "
                                 "\"%s\"",
                                 nblocks ? ", \\\n     " : "plot ", name, name);
        }
        nblocks++;
    }
    if (nblocks > 0) {
        fprintf(fg, "%s\n", plot);
    } else {
        fprintf(fg, "# (no op with a size was measured: nothing to plot)\n");
    }
    bool ok = !ferror(fd) && !ferror(fg);
    ok = (fclose(fd) == 0) && ok;
    ok = (fclose(fg) == 0) && ok;
    if (!ok) {
        tool_err("bench collective: --plot: writing %s or %s failed", file,
                 dat);
        return false;
    }
    if (o->bo_json) {
        fprintf(stderr,
                "tpipe: bench collective: plot written to %s (data "
                "%s; gnuplot %s writes %s)\n",
                file, dat, file, svg);
    } else {
        printf("# plot written to %s (data %s; gnuplot %s writes %s)\n", file,
               dat, file, svg);
    }
    return true;
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
    for (unsigned rep = 0; rep < o.bo_reps && ok; rep++) {
        tool_verbose(o.bo_verbose, "bench collective",
                     "repetition %u of %u: %d ranks", rep + 1, o.bo_reps,
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
        ok = bc_run_rep(p);
        if (!ok) {
            fflush(stdout);
            tool_err("bench collective: repetition %u of %u (world %d, "
                     "engine %s): %s",
                     rep + 1, o.bo_reps, o.bo_world, o.bo_engine, p->rp_err);
        }
        free(p);
    }
    if (ok) {
        bc_print(&o, &res, cells, ncells);
        if (o.bo_plot != NULL && !bc_plot(&o, &res, cells, ncells)) {
            ok = false;
        }
    }
    free(cells);
    free(res.rs_time);
    free(res.rs_iters);
    return ok ? TOOL_EXIT_OK : TOOL_EXIT_FAIL;
}
