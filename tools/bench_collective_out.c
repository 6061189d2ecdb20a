// SPDX-License-Identifier: Apache-2.0
// bench_collective_out.c - `tpipe bench collective`'s output: the
// table, the JSON lines and --plot.

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
#include "bench_plot.h"

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

// The table's columns: fixed widths, so that each row is printed as its
// cell completes.
#define BC_ROW_FMT "%-14s  %10s  %10s  %-5s  %-6s  %8s  %9s  %8s  %8s\n"

void
bc_print_row(const bc_opts *o, bc_results *res, const bc_cell *c, size_t idx)
{
    const char *dt = tp_dtype_name(o->bo_dtype);
    const char *engine = res->rs_engine[0] ? res->rs_engine : "?";
    bc_row w;
    bc_row_of(o, res, c, idx, &w);
    if (o->bo_json) {
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
        fflush(stdout);
        return;
    }
    if (!res->rs_header) {
        res->rs_header = true;
        printf("# tpipe bench collective: world %d, engine %s, median of %u "
               "repetition%s\n",
               o->bo_world, engine, res->rs_reps, res->rs_reps == 1 ? "" : "s");
        printf("# time_us: mean per call, max over ranks; algbw, busbw: GB/s "
               "(1e9 B/s); size: bytes\n");
        printf(BC_ROW_FMT, "op", "size", "count", "dtype", "engine", "iters",
               "time_us", "algbw", "busbw");
    }
    char sz[32], cnt[32], it[32], t[32], ab[32], bb[32];
    snprintf(sz, sizeof(sz), "%llu", (unsigned long long)c->c_size);
    snprintf(cnt, sizeof(cnt), "%llu", (unsigned long long)c->c_count);
    snprintf(it, sizeof(it), "%.0f", w.rw_iters);
    tool_fmt_num(t, sizeof(t), w.rw_time, w.rw_time < 100 ? 2 : 1);
    tool_fmt_num(ab, sizeof(ab), w.rw_algbw, 3);
    tool_fmt_num(bb, sizeof(bb), w.rw_busbw, 3);
    printf(BC_ROW_FMT, bc_ops[c->c_kind].op_name, sz, cnt,
           c->c_kind == BC_BARRIER ? "-" : dt, engine, it, t, ab, bb);
    fflush(stdout);
}

// --plot FILE: an SVG of busbw against size, one curve per op (barrier
// has no bytes), and the time per call beside it.
bool
bc_plot(const bc_opts *o, const bc_results *res, const bc_cell *cells,
        size_t ncells)
{
    bench_series bw[BC_NKINDS], lat[BC_NKINDS];
    size_t n = 0;
    uint64_t *x = calloc(ncells, sizeof(*x));
    double *y = calloc(2 * ncells, sizeof(*y));
    if (x == NULL || y == NULL) {
        tool_err("out of memory");
        free(x);
        free(y);
        return false;
    }
    for (size_t j = 0; j < o->bo_nops; j++) {
        bc_kind k = o->bo_ops[j];
        if (k == BC_BARRIER) {
            continue;
        }
        size_t first = ncells, m = 0;
        for (size_t i = 0; i < ncells; i++) {
            if (cells[i].c_kind != k) {
                continue;
            }
            first = first < i ? first : i;
            bc_row w;
            bc_row_of(o, res, &cells[i], i, &w);
            x[i] = cells[i].c_size;
            y[i] = w.rw_busbw;
            y[ncells + i] = w.rw_time;
            m++;
        }
        if (m == 0) {
            continue;
        }
        // An op's cells are consecutive (bc_cells).
        const char *name = bc_ops[k].op_name;
        bw[n] = (bench_series){name, x + first, y + first, m};
        lat[n] = (bench_series){name, x + first, y + ncells + first, m};
        n++;
    }
    const bench_panel panels[2] = {
        {.pn_title = "bus bandwidth",
         .pn_ylabel = "busbw, GB/s (1e9 B/s)",
         .pn_unit = "GB/s",
         .pn_series = bw,
         .pn_nseries = n},
        {.pn_title = "time per call",
         .pn_ylabel = "time per call, us",
         .pn_unit = "us",
         .pn_logy = true,
         .pn_series = lat,
         .pn_nseries = n},
    };
    char title[200];
    snprintf(title, sizeof(title),
             "tpipe bench collective (world %d, engine %s, dtype %s, median "
             "of %u rep%s)",
             o->bo_world, res->rs_engine[0] ? res->rs_engine : "?",
             tp_dtype_name(o->bo_dtype), res->rs_reps,
             res->rs_reps == 1 ? "" : "s");
    bool ok = bench_plot_svg(o->bo_plot, title, panels, 2);
    if (!ok) {
        tool_err("bench collective: cannot write %s: %s", o->bo_plot,
                 strerror(errno));
    } else {
        fprintf(o->bo_json ? stderr : stdout, "%splot written to %s\n",
                o->bo_json ? "tpipe: bench collective: " : "# ", o->bo_plot);
    }
    free(x);
    free(y);
    return ok;
}
