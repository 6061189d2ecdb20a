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

void
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
bool
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
