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
// Every repetition yields one value per statistic; the output is the
// median over repetitions. Every call has a deadline (--stall-timeout: the
// agent's rpc_timeout_ms, init_timeout_ms and rank 0's shutdown timeout),
// and a watchdog alarm ends the tool if the agent itself stops returning.

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <tpipe/rpc.h>

#include "bench_common.h"
#include "channel/channel.h"
#include "core/config.h"
#include "core/platform.h"
#include "tool.h"
#include "transport/transport.h"

#define BR_MAX_TRANSPORTS 4
#define BR_MAX_SIZES      16
#define BR_MIN_NOOP       100u     // noop calls measured at least
#define BR_MAX_NOOP       5000000u // ... and at most
#define BR_MIN_ECHO       5u
#define BR_MIN_ASYNC      640u
#define BR_MAX_INFLIGHT   1024u
#define BR_DEFAULT_SIZES  "64,1M,64M"

// The allow list each --transport name puts in tp_agent_options.transports.
// "shm" alone: the agent then listens and dials on shm only, so the pipe
// cannot end up on tcp.
typedef struct br_transport {
    const char *bt_name;  // --transport, the JSON "transport"
    const char *bt_allow; // tp_agent_options.transports
} br_transport;

static const br_transport br_transports[] = {
    {"shm", "shm"},
    {"tcp", "tcp"},
};

typedef struct br_opts {
    const br_transport *bo_tr[BR_MAX_TRANSPORTS];
    size_t bo_ntr;
    bool bo_all_tr;
    const char *bo_channel; // NULL: every channel
    bool bo_noop, bo_echo, bo_async, bo_init;
    uint64_t bo_sizes[BR_MAX_SIZES];
    size_t bo_nsizes;
    double bo_budget;
    unsigned bo_reps;
    unsigned bo_inflight;
    double bo_stall_s;
    bool bo_json;
    bool bo_verbose;
    tp_config bo_cfg;
} br_opts;

// Statistics of one cell (a test and size) per repetition.
enum {
    BR_F_P50,
    BR_F_P10,
    BR_F_P90,
    BR_F_MIN,
    BR_F_MAX,
    BR_F_GBPS,
    BR_F_CPS,
    BR_F_RANKS_MAX, // init: the slower of the two ranks
    BR_F_CALLS,
    BR_NF
};

// Cells: noop, async, init, then one per echo size.
enum { BR_C_NOOP, BR_C_ASYNC, BR_C_INIT, BR_C_ECHO };

// One transport's repetitions.
typedef struct br_run {
    const br_opts *rr_opts;
    const br_transport *rr_tr;
    size_t rr_ncells;
    double *rr_vals; // [cell][field][rep]
    unsigned rr_nreps;
    char rr_channel[16]; // negotiated, from the last repetition
    char rr_transport[16];
    int rr_base_threads; // threads of this process before any agent
    char rr_err[1024];
} br_run;

static double *
br_val(br_run *r, size_t cell, int field, unsigned rep)
{
    return &r->rr_vals[(cell * BR_NF + (size_t)field) * r->rr_opts->bo_reps +
                       rep];
}

static void
br_usage(FILE *f)
{
    fprintf(
        f,
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
        "\n"
        "  --transport shm|tcp|all   (comma list; default all: shm, then "
        "tcp)\n"
        "  --channel NAME            allow only this channel (default: "
        "every one)\n"
        "  --test noop,echo,async,init|all  (default all)\n"
        "  --sizes LIST              echo tensor sizes, K/M/G = KiB/MiB/GiB, "
        "multiples\n"
        "                            of 4 (default %s)\n"
        "  --budget SECONDS          time per measurement (default 1.0)\n"
        "  --reps R                  repetitions, each on a new pair of "
        "processes;\n"
        "                            report the median (default 3)\n"
        "  --inflight N              async calls per batch (default 64)\n"
        "  --json                    one JSON object per line instead of a "
        "table\n"
        "  --stall-timeout SECONDS   deadline of every call, of init and of "
        "shutdown\n"
        "                            (default 30)\n"
        "  -v, --verbose             progress and worker0's "
        "tp_rpc_get_debug_info\n"
        "                            on stderr\n"
        "\n"
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
        BR_DEFAULT_SIZES);
}

// ---- options ---------------------------------------------------------------

static bool
br_parse_transports(const char *list, br_opts *o)
{
    char buf[128];
    if (strcmp(list, "all") == 0) {
        list = "shm,tcp";
        o->bo_all_tr = true;
    }
    snprintf(buf, sizeof(buf), "%s", list);
    o->bo_ntr = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        const br_transport *t = NULL;
        for (size_t k = 0; k < TP_ARRAY_LEN(br_transports); k++) {
            if (strcmp(tok, br_transports[k].bt_name) == 0) {
                t = &br_transports[k];
            }
        }
        if (t == NULL) {
            tool_err("bench rpc: unknown transport \"%s\" (shm, tcp, all)",
                     tok);
            return false;
        }
        if (o->bo_ntr == BR_MAX_TRANSPORTS) {
            tool_err("bench rpc: too many transports");
            return false;
        }
        o->bo_tr[o->bo_ntr++] = t;
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
        } else if (strcmp(tok, "noop") == 0) {
            o->bo_noop = true;
        } else if (strcmp(tok, "echo") == 0) {
            o->bo_echo = true;
        } else if (strcmp(tok, "async") == 0) {
            o->bo_async = true;
        } else if (strcmp(tok, "init") == 0) {
            o->bo_init = true;
        } else {
            tool_err("bench rpc: unknown test \"%s\" (noop, echo, async, "
                     "init, all)",
                     tok);
            return false;
        }
    }
    if (!o->bo_noop && !o->bo_echo && !o->bo_async && !o->bo_init) {
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
    const char *transports = "all", *tests = "all", *sizes = BR_DEFAULT_SIZES;
    memset(o, 0, sizeof(*o));
    o->bo_budget = 1.0;
    o->bo_reps = 3;
    o->bo_inflight = 64;
    o->bo_stall_s = 30.0;
    for (int i = 1; i < argc; i++) {
        const char *v = NULL, *a = argv[i];
        bool bad = false;
        uint64_t u = 0;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            br_usage(stdout);
            return TOOL_EXIT_OK;
        } else if (strcmp(a, "--json") == 0) {
            o->bo_json = true;
        } else if (strcmp(a, "-v") == 0 || strcmp(a, "--verbose") == 0) {
            o->bo_verbose = true;
        } else if (tool_opt_value(argc, argv, &i, "--transport", &v, &bad)) {
            transports = v;
        } else if (tool_opt_value(argc, argv, &i, "--channel", &v, &bad)) {
            o->bo_channel = v;
        } else if (tool_opt_value(argc, argv, &i, "--test", &v, &bad)) {
            tests = v;
        } else if (tool_opt_value(argc, argv, &i, "--sizes", &v, &bad)) {
            sizes = v;
        } else if (tool_opt_value(argc, argv, &i, "--budget", &v, &bad)) {
            if (!bad &&
                (!tool_parse_double(v, &o->bo_budget) || o->bo_budget > 3600)) {
                tool_err("bench rpc: bad --budget \"%s\"", v);
                bad = true;
            }
        } else if (tool_opt_value(argc, argv, &i, "--reps", &v, &bad)) {
            if (!bad && (!tool_parse_u64(v, &u) || u < 1 || u > 1000)) {
                tool_err("bench rpc: --reps must be 1..1000");
                bad = true;
            }
            o->bo_reps = (unsigned)u;
        } else if (tool_opt_value(argc, argv, &i, "--inflight", &v, &bad)) {
            if (!bad &&
                (!tool_parse_u64(v, &u) || u < 1 || u > BR_MAX_INFLIGHT)) {
                tool_err("bench rpc: --inflight must be 1..%u",
                         BR_MAX_INFLIGHT);
                bad = true;
            }
            o->bo_inflight = (unsigned)u;
        } else if (tool_opt_value(argc, argv, &i, "--stall-timeout", &v,
                                  &bad)) {
            if (!bad && (!tool_parse_double(v, &o->bo_stall_s) ||
                         o->bo_stall_s < 0.1 || o->bo_stall_s > 86400)) {
                tool_err("bench rpc: bad --stall-timeout \"%s\"", v);
                bad = true;
            }
        } else {
            tool_err("bench rpc: unknown option \"%s\"", a);
            bad = true;
        }
        if (bad) {
            br_usage(stderr);
            return TOOL_EXIT_USAGE;
        }
    }
    if (!br_parse_transports(transports, o) || !br_parse_tests(tests, o) ||
        !br_parse_sizes(sizes, o)) {
        return TOOL_EXIT_USAGE;
    }
    if (o->bo_channel != NULL && tp__channel_find(o->bo_channel) == NULL) {
        char known[128] = "";
        size_t n = 0, off = 0;
        const tp_channel_ops *const *all = tp__channel_registry(&n);
        for (size_t k = 0; k < n && off < sizeof(known); k++) {
            off += (size_t)snprintf(known + off, sizeof(known) - off, "%s%s",
                                    k ? ", " : "", all[k]->name);
        }
        tool_err("bench rpc: unknown channel \"%s\" (%s)", o->bo_channel,
                 known);
        return TOOL_EXIT_USAGE;
    }
    tp_error *err = NULL;
    if (tp__config_load(&o->bo_cfg, &err) != TP_OK) {
        tool_err("%s", tp_error_message(err));
        tp_error_unref(err);
        return TOOL_EXIT_USAGE;
    }
    return -1;
}

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
static void
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
static void
br_watch_again(void)
{
    alarm(br_alarm_s);
}

// ---- helpers ---------------------------------------------------------------

// Writes "<what>: <message>" of @err to @buf and drops @err.
static void br_error(char *buf, size_t len, tp_status st, tp_error *err,
                     const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static void
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

static void
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
static int
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
              int fd)
{
    tp_agent_options ao;
    // The graceful shutdown waits for worker0's measurements: worker0
    // bounds them, and kills this process if they fail.
    br_agent_options(o, tr, init, INT64_C(24) * 3600 * 1000, &ao);
    tp_agent *a = NULL;
    tp_error *err = NULL;
    char line[1024];
    uint64_t t0 = tp__now_ns();
    tp_status st = tp_rpc_init("worker1", 1, 2, &ao, &a, &err);
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

// Latency samples of one measurement, in us.
typedef struct br_lat {
    double *bl_v;
    size_t bl_n, bl_cap;
} br_lat;

static bool
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

// Stores the latency statistics of @l as repetition @rep of @cell.
static void
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

static bool
br_measure_noop(br_run *r, tp_agent *a, unsigned rep)
{
    const br_opts *o = r->rr_opts;
    br_lat l = {0};
    tp_error *err = NULL;
    tp_status st = TP_OK;
    br_watch(o, r->rr_tr->bt_name, "noop");
    // Warm-up: the first call may also set up the pipe.
    for (int i = 0; i < 100 && st == TP_OK; i++) {
        st = tp_rpc_sync_rank(a, 1, "tp.noop", NULL, TP_TIMEOUT_DEFAULT, NULL,
                              &err);
    }
    uint64_t start = tp__now_ns(), budget = (uint64_t)(o->bo_budget * 1e9);
    while (st == TP_OK &&
           (l.bl_n < BR_MIN_NOOP ||
            (l.bl_n < BR_MAX_NOOP && tp__now_ns() - start < budget))) {
        uint64_t t0 = tp__now_ns();
        st = tp_rpc_sync_rank(a, 1, "tp.noop", NULL, TP_TIMEOUT_DEFAULT, NULL,
                              &err);
        uint64_t t1 = tp__now_ns();
        if (st == TP_OK && !br_lat_add(&l, (double)(t1 - t0) / 1e3)) {
            snprintf(r->rr_err, sizeof(r->rr_err), "noop: out of memory");
            free(l.bl_v);
            return false;
        }
        if ((l.bl_n & 1023) == 0) {
            br_watch_again();
        }
    }
    if (st != TP_OK) {
        br_error(r->rr_err, sizeof(r->rr_err), st, err,
                 "noop: rpc_sync(worker1, \"tp.noop\") after %zu calls",
                 l.bl_n);
        free(l.bl_v);
        return false;
    }
    br_lat_record(r, BR_C_NOOP, rep, &l, 0);
    tool_verbose(o->bo_verbose, "bench rpc", "%s: noop: %zu calls, p50 %.2f us",
                 r->rr_tr->bt_name, l.bl_n,
                 *br_val(r, BR_C_NOOP, BR_F_P50, rep));
    free(l.bl_v);
    return true;
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
static bool
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
    tp_status st = tp_rpc_init("worker0", 0, 2, &ao, &a, &err);
    double init_us = (double)(tp__now_ns() - t0) / 1e3;
    if (st != TP_OK) {
        br_error(r->rr_err, sizeof(r->rr_err), st, err,
                 "tp_rpc_init(worker0, rank 0 of 2, %s)", init);
        alarm(0);
        return false;
    }
    *br_val(r, BR_C_INIT, BR_F_P50, rep) = init_us;
    tool_verbose(o->bo_verbose, "bench rpc", "%s: repetition %u: init %.0f us",
                 tr, rep + 1, init_us);
    bool ok = true;
    if (ok && o->bo_noop) {
        ok = br_measure_noop(r, a, rep);
    }
    for (size_t i = 0; ok && o->bo_echo && i < o->bo_nsizes; i++) {
        ok = br_measure_echo(r, a, rep, i);
    }
    if (ok && o->bo_async) {
        ok = br_measure_async(r, a, rep);
    }
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
static bool
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
    int fd = -1;
    pid_t pid = bench_fork_server(&fd, r->rr_err, sizeof(r->rr_err));
    if (pid < 0) {
        return false;
    }
    if (pid == 0) {
        br_child_main(o, r->rr_tr, init, fd);
    }
    bool ok = br_rank0(r, rep, init, rep + 1 == o->bo_reps);
    // worker1's line: at once after a failure (it may say why), else
    // after its shutdown, which follows ours.
    char line[1024] = "";
    uint64_t wait_ns =
        ok ? (uint64_t)(o->bo_stall_s * 1e9) + 5000000000u : 2000000000u;
    tool_line_status ls = tool_read_line(fd, tp__now_ns() + wait_ns, line,
                                         sizeof(line), why, sizeof(why));
    close(fd);
    double child_us = NAN;
    if (ls == TOOL_LINE_OK && strncmp(line, "ok ", 3) == 0) {
        child_us = strtod(line + 3, NULL);
    } else if (ls == TOOL_LINE_OK && strncmp(line, "error ", 6) == 0) {
        size_t off = strlen(r->rr_err);
        snprintf(r->rr_err + off, sizeof(r->rr_err) - off, "%sworker1: %.900s",
                 ok ? "" : "; ", line + 6);
        ok = false;
    } else if (ok) {
        snprintf(r->rr_err, sizeof(r->rr_err), "worker1 (pid %d): %s", (int)pid,
                 ls == TOOL_LINE_TIMEOUT ? "no report after its shutdown"
                 : ls == TOOL_LINE_EOF   ? "exited without a report"
                                         : why);
        ok = false;
    }
    char reap[256] = "";
    if (!bench_reap_server(pid, ok, reap, sizeof(reap)) && ok) {
        snprintf(r->rr_err, sizeof(r->rr_err), "worker1: %s", reap);
        ok = false;
    }
    if (ok) {
        double p0 = *br_val(r, BR_C_INIT, BR_F_P50, rep);
        *br_val(r, BR_C_INIT, BR_F_RANKS_MAX, rep) =
            isfinite(child_us) && child_us > p0 ? child_us : p0;
    }
    return ok;
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

static void
br_json_field(const char *name, double v)
{
    printf(",\"%s\":", name);
    tool_json_num(stdout, v);
}

static void
br_print_cell(br_run *r, size_t cell, const char *test, uint64_t size,
              tool_table *tab)
{
    br_row m;
    br_medians(r, cell, &m);
    if (size > 0) {
        // GB/s of the reported p50 (a median of per-repetition GB/s would
        // not match it).
        m.f[BR_F_GBPS] = 2 * (double)size / m.f[BR_F_P50] / 1e3;
    }
    const char *tr = r->rr_tr->bt_name;
    if (r->rr_opts->bo_json) {
        printf("{\"bench\":\"rpc\",\"transport\":");
        tool_json_str(stdout, tr);
        printf(",\"channel\":");
        if (r->rr_channel[0] != '\0') {
            tool_json_str(stdout, r->rr_channel);
        } else {
            printf("null");
        }
        printf(",\"test\":\"%s\",\"size\":%llu", test,
               (unsigned long long)size);
        br_json_field("p50_us", m.f[BR_F_P50]);
        br_json_field("p10_us", m.f[BR_F_P10]);
        br_json_field("p90_us", m.f[BR_F_P90]);
        br_json_field("min_us", m.f[BR_F_MIN]);
        br_json_field("max_us", m.f[BR_F_MAX]);
        br_json_field("gbps", m.f[BR_F_GBPS]);
        br_json_field("calls_per_s", m.f[BR_F_CPS]);
        br_json_field("init_max_us", m.f[BR_F_RANKS_MAX]);
        br_json_field("calls", m.f[BR_F_CALLS]);
        printf(",\"reps\":%u}\n", r->rr_nreps);
        fflush(stdout);
        return;
    }
    char sz[32], c[BR_NF][32];
    if (size > 0) {
        tool_format_size(size, sz, sizeof(sz));
    } else {
        snprintf(sz, sizeof(sz), "-");
    }
    tool_fmt_num(c[BR_F_P50], 32, m.f[BR_F_P50], 2);
    tool_fmt_num(c[BR_F_P10], 32, m.f[BR_F_P10], 2);
    tool_fmt_num(c[BR_F_P90], 32, m.f[BR_F_P90], 2);
    tool_fmt_num(c[BR_F_MIN], 32, m.f[BR_F_MIN], 2);
    tool_fmt_num(c[BR_F_GBPS], 32, m.f[BR_F_GBPS], 3);
    tool_fmt_num(c[BR_F_CPS], 32, m.f[BR_F_CPS], 0);
    tool_fmt_num(c[BR_F_RANKS_MAX], 32, m.f[BR_F_RANKS_MAX], 0);
    tool_fmt_num(c[BR_F_CALLS], 32, m.f[BR_F_CALLS], 0);
    const char *cells[] = {
        tr,
        r->rr_channel[0] ? r->rr_channel : "-",
        test,
        sz,
        c[BR_F_P50],
        c[BR_F_P10],
        c[BR_F_P90],
        c[BR_F_MIN],
        c[BR_F_GBPS],
        c[BR_F_CPS],
        c[BR_F_RANKS_MAX],
        c[BR_F_CALLS],
    };
    tool_table_add(tab, cells);
}

static void
br_print_run(br_run *r, tool_table *tab)
{
    const br_opts *o = r->rr_opts;
    if (o->bo_noop) {
        br_print_cell(r, BR_C_NOOP, "noop", 0, tab);
    }
    for (size_t i = 0; o->bo_echo && i < o->bo_nsizes; i++) {
        br_print_cell(r, BR_C_ECHO + i, "echo", o->bo_sizes[i], tab);
    }
    if (o->bo_async) {
        br_print_cell(r, BR_C_ASYNC, "async", 0, tab);
    }
    if (o->bo_init) {
        br_print_cell(r, BR_C_INIT, "init", 0, tab);
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

    tool_table tab;
    tool_table_init(&tab, 12);
    for (size_t c = 4; c < 12; c++) {
        tab.tt_right[c] = true;
    }
    static const char *const head[] = {
        "transport", "channel", "test", "size",    "p50_us",      "p10_us",
        "p90_us",    "min_us",  "GB/s", "calls/s", "init_max_us", "calls"};
    tool_table_add(&tab, head);

    size_t ncells = BR_C_ECHO + o.bo_nsizes;
    double *vals = malloc(ncells * BR_NF * o.bo_reps * sizeof(double));
    if (vals == NULL) {
        tool_err("out of memory");
        return TOOL_EXIT_FAIL;
    }
    bool failed = false;
    size_t measured = 0;
    for (size_t ti = 0; ti < o.bo_ntr; ti++) {
        const br_transport *tr = o.bo_tr[ti];
        // A transport that cannot work here is skipped before forking.
        char why[256] = "";
        const tp_transport_ops *ops = tp__transport_find(tr->bt_name);
        if (ops != NULL && !ops->is_viable(&o.bo_cfg, why, sizeof(why))) {
            fprintf(stderr, "tpipe: bench rpc: skipping %s: %s\n", tr->bt_name,
                    why);
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
        bool ok = true;
        for (unsigned rep = 0; rep < o.bo_reps && ok; rep++) {
            tool_verbose(o.bo_verbose, "bench rpc", "%s: repetition %u of %u",
                         tr->bt_name, rep + 1, o.bo_reps);
            ok = br_run_rep(&r, rep);
            if (ok) {
                r.rr_nreps++;
            }
        }
        if (!ok) {
            fflush(stdout);
            tool_err("bench rpc: %s: %s", tr->bt_name, r.rr_err);
            failed = true;
            continue;
        }
        measured++;
        br_print_run(&r, &tab);
    }
    if (!o.bo_json && measured > 0) {
        tool_table_print(&tab, stdout);
    }
    tool_table_fini(&tab);
    free(vals);
    if (measured == 0 && !failed) {
        tool_err("bench rpc: no transport could be measured here");
        failed = true;
    }
    return failed ? TOOL_EXIT_FAIL : TOOL_EXIT_OK;
}
