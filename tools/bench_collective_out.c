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
#include "bench_out.h"
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

// The table's columns (fixed widths, so that each row is printed as its
// cell completes) and the JSON keys. time_us has 2 decimals below 100 us,
// 1 above (its precision comes with each value).
static const bench_col bc_cols[] = {
    {"op", -14, "op", BENCH_COL_STR, 0},
    {"size", 10, "size", BENCH_COL_U64, 0},
    {"count", 10, "count", BENCH_COL_U64, 0},
    {"dtype", -5, "dtype", BENCH_COL_STR, 0}, // NULL for barrier
    {NULL, 0, "world", BENCH_COL_U64, 0},
    {"engine", -6, "engine", BENCH_COL_STR, 0},
    {"iters", 8, "iters", BENCH_COL_U64, 0},
    {"time_us", 9, "time_us", BENCH_COL_NUM, -1},
    {"algbw", 8, "algbw_gbps", BENCH_COL_NUM, 3},
    {"busbw", 8, "busbw_gbps", BENCH_COL_NUM, 3},
    {NULL, 0, "busbw_factor", BENCH_COL_NUM, 3},
    {NULL, 0, "warmup", BENCH_COL_U64, 0},
    {NULL, 0, "time_min_us", BENCH_COL_NUM, 2},
    {NULL, 0, "time_max_us", BENCH_COL_NUM, 2},
    {NULL, 0, "reps", BENCH_COL_U64, 0},
};

void
bc_print_row(const bc_opts *o, bc_results *res, const bc_cell *c, size_t idx)
{
    const char *engine = res->rs_engine[0] ? res->rs_engine : "?";
    bench_out *out = &res->rs_out;
    if (out->out_cols == NULL) {
        bench_out_init(out, "collective", bc_cols, TP_ARRAY_LEN(bc_cols),
                       o->bo_json);
        if (!o->bo_json) {
            printf("# tpipe bench collective: world %d, engine %s, median of "
                   "%u repetition%s\n",
                   o->bo_world, engine, res->rs_reps,
                   res->rs_reps == 1 ? "" : "s");
            printf("# time_us: mean per call, max over ranks; algbw, busbw: "
                   "GB/s (1e9 B/s); size: bytes\n");
        }
    }
    bc_row w;
    bc_row_of(o, res, c, idx, &w);
    // The median of the iteration counts, rounded as printf's %.0f does.
    uint64_t iters = (uint64_t)nearbyint(w.rw_iters);
    const bench_val vals[TP_ARRAY_LEN(bc_cols)] = {
        {.v_str = bc_ops[c->c_kind].op_name},
        {.v_u64 = c->c_size},
        {.v_u64 = c->c_count},
        {.v_str = c->c_kind == BC_BARRIER ? NULL : tp_dtype_name(o->bo_dtype)},
        {.v_u64 = (uint64_t)o->bo_world},
        {.v_str = engine},
        {.v_u64 = iters},
        {.v_num = w.rw_time, .v_prec = w.rw_time < 100 ? 2 : 1},
        {.v_num = w.rw_algbw},
        {.v_num = w.rw_busbw},
        {.v_num = w.rw_factor},
        {.v_u64 = o->bo_warmup},
        {.v_num = w.rw_min},
        {.v_num = w.rw_max},
        {.v_u64 = res->rs_reps},
    };
    bench_out_row(out, vals);
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
