// SPDX-License-Identifier: Apache-2.0
// bench_common.c - what `tpipe bench transport` and `tpipe bench pipe`
// share (bench_common.h).

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <tpipe/config.h>
#include <tpipe/info.h>

#include "bench_common.h"
#include "core/platform.h"
#include "tool.h"

// ---- options ---------------------------------------------------------------

void
bench_opts_init(bench_opts *o, const char *what, const char *vprefix)
{
    memset(o, 0, sizeof(*o));
    o->bo_what = what;
    o->bo_vprefix = vprefix;
    o->bo_sizes_arg = BENCH_DEFAULT_SIZES;
    o->bo_test_arg = "all";
    o->bo_iters = 1000000;
    o->bo_budget = 0.5;
    o->bo_window = o->bo_window64 = 4;
    o->bo_reps = o->bo_reps64 = 1;
    o->bo_stall_s = 30.0;
}

bool
bench_opt_arg(const char *what, const bench_opt *opts, size_t nopts, int argc,
              char **argv, int *i, bool *bad_p)
{
    const char *a = argv[*i], *v = NULL;
    for (size_t k = 0; k < nopts; k++) {
        const bench_opt *op = &opts[k];
        if (op->opt_kind == BENCH_OPT_FLAG) {
            if (strcmp(a, op->opt_name) == 0 ||
                (op->opt_alias != NULL && strcmp(a, op->opt_alias) == 0)) {
                *(bool *)op->opt_target = true;
                return true;
            }
            continue;
        }
        if (!tool_opt_value(argc, argv, i, op->opt_name, &v, bad_p)) {
            continue;
        }
        if (*bad_p) {
            return true;
        }
        uint64_t u = 0;
        double d = 0;
        switch (op->opt_kind) {
        case BENCH_OPT_STR:
            *(const char **)op->opt_target = v;
            break;
        case BENCH_OPT_U64:
            if (!tool_parse_u64(v, &u) || (double)u < op->opt_min ||
                (double)u > op->opt_max) {
                tool_err("%s: %s must be %.0f..%.0f, not \"%s\"", what,
                         op->opt_name, op->opt_min, op->opt_max, v);
                *bad_p = true;
            } else {
                *(uint64_t *)op->opt_target = u;
            }
            break;
        case BENCH_OPT_DOUBLE:
            if (!tool_parse_double(v, &d) || d < op->opt_min ||
                d > op->opt_max) {
                tool_err("%s: bad %s \"%s\" (%g..%g)", what, op->opt_name, v,
                         op->opt_min, op->opt_max);
                *bad_p = true;
            } else {
                *(double *)op->opt_target = d;
            }
            break;
        case BENCH_OPT_SIZE:
            if (!tool_parse_size(v, &u) || (double)u < op->opt_min ||
                (double)u > op->opt_max) {
                char lo[32], hi[32];
                tool_format_size((uint64_t)op->opt_min, lo, sizeof(lo));
                tool_format_size((uint64_t)op->opt_max, hi, sizeof(hi));
                tool_err("%s: %s must be %s..%s, not \"%s\"", what,
                         op->opt_name, lo, hi, v);
                *bad_p = true;
            } else {
                *(uint64_t *)op->opt_target = u;
            }
            break;
        case BENCH_OPT_FLAG:
            break;
        }
        return true;
    }
    return false;
}

// The usage's option column: "  --name ARG" padded to this, then the help.
#define BENCH_USAGE_COL 28

void
bench_usage_print(FILE *f, const bench_usage *u, const bench_opt *opts,
                  size_t nopts)
{
    fputs(u->bu_head, f);
    fputs("\n", f);
    for (size_t k = 0; k < nopts; k++) {
        const bench_opt *op = &opts[k];
        if (op->opt_help == NULL) {
            continue;
        }
        char left[96];
        snprintf(left, sizeof(left), "%s%s%s%s%s",
                 op->opt_alias != NULL ? op->opt_alias : "",
                 op->opt_alias != NULL ? ", " : "", op->opt_name,
                 op->opt_arg != NULL ? " " : "",
                 op->opt_arg != NULL ? op->opt_arg : "");
        int n = fprintf(f, "  %s", left);
        fprintf(f, "%*s", n < BENCH_USAGE_COL - 1 ? BENCH_USAGE_COL - n : 2,
                "");
        for (const char *h = op->opt_help; *h != '\0'; h++) {
            fputc(*h, f);
            if (*h == '\n') {
                fprintf(f, "%*s", BENCH_USAGE_COL, "");
            }
        }
        fputc('\n', f);
    }
    if (u->bu_tail != NULL) {
        fputs("\n", f);
        fputs(u->bu_tail, f);
    }
}

void
bench_opt_set_help(bench_opt *opts, size_t nopts, const char *name,
                   const char *help)
{
    for (size_t k = 0; k < nopts; k++) {
        if (strcmp(opts[k].opt_name, name) == 0) {
            opts[k].opt_help = help;
        }
    }
}

int
bench_parse_args(const char *what, const bench_opt *opts, size_t nopts,
                 const bench_usage *usage, int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        bool bad = false;
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            bench_usage_print(stdout, usage, opts, nopts);
            return TOOL_EXIT_OK;
        }
        if (!bench_opt_arg(what, opts, nopts, argc, argv, &i, &bad)) {
            tool_err("%s: unknown option \"%s\"", what, argv[i]);
            bad = true;
        }
        if (bad) {
            bench_usage_print(stderr, usage, opts, nopts);
            return TOOL_EXIT_USAGE;
        }
    }
    return -1;
}

bool
bench_name_check(const char *what, const char *noun, const char *name,
                 const char *const *valid, size_t nvalid)
{
    char list[256] = "";
    size_t off = 0;
    for (size_t k = 0; k < nvalid; k++) {
        if (strcmp(name, valid[k]) == 0) {
            return true;
        }
        if (off < sizeof(list)) {
            off += (size_t)snprintf(list + off, sizeof(list) - off, "%s%s",
                                    k ? ", " : "", valid[k]);
        }
    }
    tool_err("%s: unknown %s \"%s\" (valid: %s)", what, noun, name, list);
    return false;
}

_Static_assert(BT_MIN_SIZE == 16 && BT_MAX_WINDOW == 64,
               "the usage below says these numbers");

// The options every bench command shares (bench_opts), as a table.
size_t
bench_opts_table(bench_opts *o, bench_opt *out)
{
    const bench_opt opts[BENCH_OPTS_N] = {
        {"--sizes", NULL, BENCH_OPT_STR, &o->bo_sizes_arg, 0, 0, "LIST",
         "message sizes, K/M/G = KiB/MiB/GiB (default\n" BENCH_DEFAULT_SIZES
         "; at least 16)"},
        {"--test", NULL, BENCH_OPT_STR, &o->bo_test_arg, 0, 0,
         "pingpong|stream|all", "(default all)"},
        {"--iters", NULL, BENCH_OPT_U64, &o->bo_iters, 10, 1e12, "N",
         "at most N measured iterations (stream: messages)\nper measurement "
         "(default 1000000; at least 10)"},
        {"--budget", NULL, BENCH_OPT_DOUBLE, &o->bo_budget, 0, 3600, "SECONDS",
         "time per measurement (default 0.5, at most 3600)"},
        {"--window", NULL, BENCH_OPT_U64, &o->bo_window64, 1, BT_MAX_WINDOW,
         "W", "stream writes in flight (default 4, max 64)"},
        {"--reps", NULL, BENCH_OPT_U64, &o->bo_reps64, 1, 1000, "R",
         "repeat each measurement R times (at most 1000);\nreport the median "
         "of the medians"},
        {"--json", NULL, BENCH_OPT_FLAG, &o->bo_json, 0, 0, NULL,
         "one JSON object per line instead of a table"},
        {"--stall-timeout", NULL, BENCH_OPT_DOUBLE, &o->bo_stall_s, 0.001,
         86400, "SECONDS",
         "abort a measurement that makes no progress for\nthis long (default "
         "30)"},
        {"--verbose", "-v", BENCH_OPT_FLAG, &o->bo_verbose, 0, 0, NULL,
         "progress on stderr"},
    };
    memcpy(out, opts, sizeof(opts));
    return BENCH_OPTS_N;
}

bool
bench_opts_test(bench_opts *o)
{
    static const char *const tests[] = {"pingpong", "stream", "all"};
    const char *test = o->bo_test_arg;
    o->bo_window = (unsigned)o->bo_window64;
    o->bo_reps = (unsigned)o->bo_reps64;
    if (strcmp(test, "all") == 0 || strcmp(test, "both") == 0) {
        o->bo_pingpong = o->bo_stream = true;
    } else if (strcmp(test, "pingpong") == 0) {
        o->bo_pingpong = true;
    } else if (strcmp(test, "stream") == 0) {
        o->bo_stream = true;
    } else {
        return bench_name_check(o->bo_what, "test", test, tests,
                                TP_ARRAY_LEN(tests));
    }
    return true;
}

static bool
bench_parse_sizes(bench_opts *o)
{
    const char *what = o->bo_what;
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", o->bo_sizes_arg);
    o->bo_nsizes = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        uint64_t v;
        if (!tool_parse_size(tok, &v)) {
            tool_err("%s: bad size \"%s\"", what, tok);
            return false;
        }
        if (v < BT_MIN_SIZE) {
            tool_err("%s: size %s is below the minimum of %u bytes", what, tok,
                     BT_MIN_SIZE);
            return false;
        }
        if (o->bo_nsizes == BENCH_MAX_SIZES) {
            tool_err("%s: at most %d sizes", what, BENCH_MAX_SIZES);
            return false;
        }
        o->bo_sizes[o->bo_nsizes++] = v;
        o->bo_max_size = v > o->bo_max_size ? v : o->bo_max_size;
    }
    if (o->bo_nsizes == 0) {
        tool_err("%s: --sizes is empty", what);
        return false;
    }
    return true;
}

static void
bench_env_nop_cb(const tp_config_item *item, void *arg)
{
    (void)item;
    (void)arg;
}

// A launcher variable as an integer in [@lo, @hi]; -1 when unset or bad.
static long
bench_env_int(const char *name, long lo, long hi)
{
    const char *v = getenv(name);
    char *end = NULL;
    if (v == NULL || *v == '\0') {
        return -1;
    }
    errno = 0;
    long n = strtol(v, &end, 10);
    return errno != 0 || *end != '\0' || n < lo || n > hi ? -1 : n;
}

bool
bench_launch_get(const char *what, bool forced, int min_world, int max_world,
                 bench_launch *l)
{
    const char *rank = getenv("RANK"), *world = getenv("WORLD_SIZE");
    memset(l, 0, sizeof(*l));
    if (!forced && (rank == NULL || world == NULL)) {
        return true;
    }
    l->bl_on = true;
    long w = bench_env_int("WORLD_SIZE", min_world, max_world);
    long r = w > 0 ? bench_env_int("RANK", 0, w - 1) : -1;
    if (w < 0 || r < 0) {
        tool_err("%s: a launched run needs WORLD_SIZE in %d..%d and RANK in "
                 "0..WORLD_SIZE-1 (RANK=%s WORLD_SIZE=%s)",
                 what, min_world, max_world, rank ? rank : "(unset)",
                 world ? world : "(unset)");
        return false;
    }
    l->bl_rank = (int)r;
    l->bl_world = (int)w;
    long lr = bench_env_int("LOCAL_RANK", 0, 1 << 20);
    l->bl_local_rank = lr >= 0 ? (int)lr : (int)r;
    const char *im = getenv("TP_INIT_METHOD");
    l->bl_url = im != NULL && *im != '\0' ? im : "env://";
    return true;
}

bool
bench_env_check(void)
{
    tp_error *err = NULL;
    if (tp_config_visit(bench_env_nop_cb, NULL, &err) != TP_OK) {
        tool_err("%s", tp_error_message(err));
        tp_error_unref(err);
        return false;
    }
    return true;
}

bool
bench_opts_finish(bench_opts *o)
{
    return bench_env_check() && bench_parse_sizes(o);
}

uint64_t
bench_stall_ns(const bench_opts *o)
{
    return (uint64_t)(o->bo_stall_s * 1e9);
}

// ---- the server child ------------------------------------------------------

pid_t
bench_fork_server(int *fd_p, char *err, size_t err_len)
{
    int pfd[2];
    if (pipe(pfd) != 0) {
        snprintf(err, err_len, "pipe: %s", strerror(errno));
        return -1;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(err, err_len, "fork: %s", strerror(errno));
        close(pfd[0]);
        close(pfd[1]);
        return -1;
    }
    if (pid == 0) {
        close(pfd[0]);
        // Die with the parent, whatever happens to it.
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) {
            _exit(1);
        }
        *fd_p = pfd[1];
        return 0;
    }
    close(pfd[1]);
    *fd_p = pfd[0];
    return pid;
}

bool
bench_server_report(int wfd, bench_outcome rc, const char *text)
{
    char msg[1600];
    int n = snprintf(msg, sizeof(msg), "%s %s\n",
                     rc == BENCH_OK     ? "OK"
                     : rc == BENCH_SKIP ? "SKIP"
                                        : "ERR",
                     text);
    if (n >= (int)sizeof(msg)) {
        n = (int)sizeof(msg) - 1;
        msg[n - 1] = '\n';
    }
    return write(wfd, msg, (size_t)n) == n;
}

bench_outcome
bench_server_start(const bench_opts *o, void (*child_fn)(void *arg, int wfd),
                   void *arg, char *addr, size_t addr_len, pid_t *pid_p,
                   char *err, size_t err_len)
{
    int fd;
    pid_t pid = bench_fork_server(&fd, err, err_len);
    if (pid < 0) {
        return BENCH_FAIL;
    }
    if (pid == 0) {
        child_fn(arg, fd);
        _exit(1);
    }
    char line[1600];
    uint64_t deadline = tp__now_ns() + bench_stall_ns(o);
    tool_line_status ls =
        tool_read_line(fd, deadline, line, sizeof(line), err, err_len);
    close(fd);
    bench_outcome out = BENCH_FAIL;
    if (ls == TOOL_LINE_TIMEOUT) {
        snprintf(err, err_len, "server did not report its address within %g s",
                 o->bo_stall_s);
    } else if (ls == TOOL_LINE_EOF) {
        snprintf(err, err_len, "server exited before reporting its address");
    } else if (ls == TOOL_LINE_OK && strncmp(line, "OK ", 3) == 0) {
        if (strlen(line + 3) < addr_len) {
            memcpy(addr, line + 3, strlen(line + 3) + 1);
            *pid_p = pid;
            return BENCH_OK;
        }
        snprintf(err, err_len, "server address too long");
    } else if (ls == TOOL_LINE_OK) {
        out = strncmp(line, "SKIP ", 5) == 0 ? BENCH_SKIP : BENCH_FAIL;
        const char *why = strchr(line, ' ');
        snprintf(err, err_len, "server: %.1500s", why ? why + 1 : line);
    }
    // A server that said why exits by itself; one that did not is killed.
    tool_reap(pid, 1000, ls != TOOL_LINE_OK);
    return out;
}

void
bench_skip(const char *what, const char *label, const char *fmt, ...)
{
    fflush(stdout);
    fprintf(stderr, "tpipe: %s: skipping %s: ", what, label);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

bool
bench_viable(const char *what, const char *label, tool_backend_kind kind,
             const char *name)
{
    char why[256] = "";
    if (tool_backend_viable(kind, name, why, sizeof(why))) {
        return true;
    }
    bench_skip(what, label, "%s %s: %s", tool_backend_kind_name(kind), name,
               why);
    return false;
}

size_t
bench_backends(const char *what, tool_backend_kind kind, bool viable_only,
               const char **names, size_t cap)
{
    tp_backend_info all[TP_INFO_MAX];
    size_t n = 0, kept = 0;
    tp_status st = kind == TOOL_TRANSPORT
                       ? tp_info_transports(0, all, TP_INFO_MAX, &n, NULL)
                       : tp_info_channels(0, all, TP_INFO_MAX, &n, NULL);
    if (st != TP_OK) {
        return 0;
    }
    for (size_t i = 0; i < n && i < TP_INFO_MAX && kept < cap; i++) {
        if (kind == TOOL_PIPE_CHANNEL && all[i].device_channel) {
            continue; // taken beside the pipe's channel (--device)
        }
        if (viable_only && !all[i].viable) {
            char label[64];
            snprintf(label, sizeof(label), "%s %s",
                     tool_backend_kind_name(kind), all[i].name);
            bench_skip(what, label, "%s", all[i].reason);
            continue;
        }
        names[kept++] = all[i].name;
    }
    return kept;
}

bool
bench_reap_server(pid_t pid, bool ok, char *err, size_t err_len)
{
    int status = tool_reap(pid, ok ? 5000 : 0, !ok);
    if (!ok || (WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
        return ok;
    }
    if (status != -1 && WIFSIGNALED(status)) {
        snprintf(err, err_len, "server %d killed by signal %d", (int)pid,
                 WTERMSIG(status));
    } else {
        snprintf(err, err_len, "server %d exited with status %d", (int)pid,
                 status == -1 ? -1 : WEXITSTATUS(status));
    }
    return false;
}

bool
bench_wait(bt_sync *s, const bench_opts *o, const char *what, uint64_t size,
           char *err, size_t err_len)
{
    int rc = bt_sync_wait(s, bench_stall_ns(o));
    if (rc == 0) {
        return true;
    }
    char where[96];
    if (size > 0) {
        char sz[32];
        tool_format_size(size, sz, sizeof(sz));
        snprintf(where, sizeof(where), "%s, size %s (%llu bytes)", what, sz,
                 (unsigned long long)size);
    } else {
        snprintf(where, sizeof(where), "%s", what);
    }
    if (rc == -2) {
        snprintf(err, err_len, "%s: stalled, no progress for %g s", where,
                 o->bo_stall_s);
    } else {
        snprintf(err, err_len, "%s: %s", where, s->bs_msg);
    }
    return false;
}

// ---- results ---------------------------------------------------------------

void
bench_cells_reset(const bench_opts *o, bench_cell *cells, double *vals)
{
    unsigned reps = o->bo_reps;
    for (size_t k = 0; k < 2 * o->bo_nsizes; k++) {
        double *base = vals + k * 4 * reps;
        cells[k] = (bench_cell){
            .bc_size = o->bo_sizes[k % o->bo_nsizes],
            .bc_stream = k >= o->bo_nsizes,
            .bc_index = k,
            .bc_p50 = base,
            .bc_p90 = base + reps,
            .bc_p99 = base + 2 * reps,
            .bc_gbps = base + 3 * reps,
        };
    }
}

void
bench_cell_pingpong(const bench_opts *o, const char *label, uint64_t size,
                    double *lat, size_t n, bench_cell *cell)
{
    qsort(lat, n, sizeof(double), tool_cmp_double);
    unsigned k = cell->bc_n++;
    cell->bc_p50[k] = tool_median(lat, n);
    cell->bc_p90[k] = tool_quantile(lat, n, 0.90);
    cell->bc_p99[k] = tool_quantile(lat, n, 0.99);
    cell->bc_gbps[k] = NAN;
    cell->bc_iters += n;
    tool_verbose(o->bo_verbose, o->bo_vprefix,
                 "%s pingpong %llu: %zu rounds, p50 %.2f us", label,
                 (unsigned long long)size, n, cell->bc_p50[k]);
    if (cell->bc_n == o->bo_reps && o->bo_done_fn != NULL) {
        o->bo_done_fn(o->bo_done_arg, cell);
    }
}

bool
bench_stream(const bench_opts *o, const char *label, uint64_t size,
             double bytes,
             bool (*run)(void *arg, uint64_t count, double *secs_p), void *arg,
             bench_cell *cell)
{
    uint64_t count;
    double secs;
    if (!tool_stream_measure(o->bo_window, o->bo_iters, o->bo_budget, run, arg,
                             &count, &secs)) {
        return false;
    }
    unsigned k = cell->bc_n++;
    cell->bc_p50[k] = cell->bc_p90[k] = cell->bc_p99[k] = NAN;
    cell->bc_gbps[k] = (double)count * bytes / secs / 1e9;
    cell->bc_iters += count;
    tool_verbose(o->bo_verbose, o->bo_vprefix,
                 "%s stream %llu: %llu messages in %.3f s, %.3f GB/s", label,
                 (unsigned long long)size, (unsigned long long)count, secs,
                 cell->bc_gbps[k]);
    if (cell->bc_n == o->bo_reps && o->bo_done_fn != NULL) {
        o->bo_done_fn(o->bo_done_arg, cell);
    }
    return true;
}

bool
bench_cell_medians(bench_cell *cell, bench_medians *m)
{
    if (cell->bc_n == 0) {
        return false;
    }
    m->bm_p50 = tool_median(cell->bc_p50, cell->bc_n);
    m->bm_p90 = tool_median(cell->bc_p90, cell->bc_n);
    m->bm_p99 = tool_median(cell->bc_p99, cell->bc_n);
    m->bm_gbps = tool_median(cell->bc_gbps, cell->bc_n);
    return true;
}
