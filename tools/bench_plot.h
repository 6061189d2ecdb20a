/* SPDX-License-Identifier: Apache-2.0 */
/* bench_plot.h - the SVG charts of `tpipe bench pipe --plot` and `tpipe
 * bench collective --plot`, written without gnuplot: one or more panels
 * side by side, each a value against size (log2 x axis), one polyline per
 * series with its name in the legend as given, and dashed ceilings whose
 * labels sit in the margin, off the data. */
#ifndef TP_TOOLS_BENCH_PLOT_H
#define TP_TOOLS_BENCH_PLOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// One curve: @se_y[i] at size @se_x[i]; a NAN point is left out.
typedef struct bench_series {
    const char *se_name; // the legend, literally (XML-escaped)
    const uint64_t *se_x;
    const double *se_y;
    size_t se_n;
} bench_series;

// A horizontal reference line (a measured ceiling); NAN: left out.
typedef struct bench_ceiling {
    const char *ce_name;
    double ce_value;
} bench_ceiling;

typedef struct bench_panel {
    const char *pn_title;
    const char *pn_ylabel; // "GB/s (1e9 B/s)"
    const char *pn_unit;   // in points' tooltips and ceiling labels: "GB/s"
    bool pn_logy;          // log10 y axis (latencies)
    const bench_series *pn_series;
    size_t pn_nseries;
    const bench_ceiling *pn_ceils;
    size_t pn_nceils;
} bench_panel;

// Writes @npanels panels side by side under @title to @path. False with
// errno set when the file cannot be written.
bool bench_plot_svg(const char *path, const char *title,
                    const bench_panel *panels, size_t npanels);

#endif
