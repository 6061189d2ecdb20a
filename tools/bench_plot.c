// SPDX-License-Identifier: Apache-2.0
// bench_plot.c - the benchmarks' SVG charts (bench_plot.h).

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "bench_plot.h"
#include "tool.h"

static const char *const plot_colors[] = {
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
    "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f",
};
#define PLOT_NCOLORS (sizeof(plot_colors) / sizeof(plot_colors[0]))

// A panel's geometry: the plot area is [pl_x, pl_x + pl_w] x [pl_y,
// pl_y + pl_h]; the ceilings' labels go right of it, the legend below.
#define PLOT_W      620.0
#define PLOT_L      70.0
#define PLOT_R      170.0
#define PLOT_T      60.0
#define PLOT_PH     380.0
#define PLOT_B      56.0 // tick labels and the x axis' title
#define PLOT_LROW   18.0 // one legend row
#define PLOT_LCOLS  2
#define PLOT_LABELH 28.0 // a ceiling's label: two lines

typedef struct plot_axes {
    double ax_x, ax_y, ax_w, ax_h; // the plot area
    double ax_x0, ax_x1;           // log2 of the sizes
    double ax_y0, ax_y1;           // linear, or log10 when ax_log
    bool ax_log;
} plot_axes;

// Writes @s with &, <, >, " escaped.
static void
plot_text(FILE *f, const char *s)
{
    for (; *s != '\0'; s++) {
        switch (*s) {
        case '&':
            fputs("&amp;", f);
            break;
        case '<':
            fputs("&lt;", f);
            break;
        case '>':
            fputs("&gt;", f);
            break;
        case '"':
            fputs("&quot;", f);
            break;
        default:
            fputc(*s, f);
        }
    }
}

static double
plot_px(const plot_axes *a, uint64_t size)
{
    return a->ax_x +
           (log2((double)size) - a->ax_x0) / (a->ax_x1 - a->ax_x0) * a->ax_w;
}

static double
plot_py(const plot_axes *a, double v)
{
    double t = a->ax_log ? log10(v) : v;
    return a->ax_y + a->ax_h - (t - a->ax_y0) / (a->ax_y1 - a->ax_y0) * a->ax_h;
}

// A round step for about 6 ticks up to @max.
static double
plot_nice_step(double max)
{
    double raw = max / 6, p = pow(10, floor(log10(raw)));
    double m = raw / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
}

static bool
plot_visible(const bench_panel *p, double v)
{
    return isfinite(v) && (!p->pn_logy || v > 0);
}

// The axes' ranges from the data and ceilings; the y step (linear) in
// *step_p.
static void
plot_ranges(const bench_panel *p, plot_axes *a, double *step_p)
{
    double xmin = INFINITY, xmax = -INFINITY;
    double ymin = INFINITY, ymax = -INFINITY;
    for (size_t s = 0; s < p->pn_nseries; s++) {
        const bench_series *se = &p->pn_series[s];
        for (size_t i = 0; i < se->se_n; i++) {
            if (se->se_x[i] > 0) {
                xmin = fmin(xmin, log2((double)se->se_x[i]));
                xmax = fmax(xmax, log2((double)se->se_x[i]));
            }
            if (plot_visible(p, se->se_y[i])) {
                ymin = fmin(ymin, se->se_y[i]);
                ymax = fmax(ymax, se->se_y[i]);
            }
        }
    }
    for (size_t c = 0; c < p->pn_nceils; c++) {
        if (plot_visible(p, p->pn_ceils[c].ce_value)) {
            ymin = fmin(ymin, p->pn_ceils[c].ce_value);
            ymax = fmax(ymax, p->pn_ceils[c].ce_value);
        }
    }
    if (!isfinite(xmin)) {
        xmin = 6;
        xmax = 26;
    }
    a->ax_x0 = floor(xmin);
    a->ax_x1 = ceil(xmax);
    if (a->ax_x1 <= a->ax_x0) {
        a->ax_x0 -= 1;
        a->ax_x1 += 1;
    }
    a->ax_log = p->pn_logy;
    *step_p = 1;
    if (a->ax_log) {
        a->ax_y0 = isfinite(ymin) ? floor(log10(ymin)) : 0;
        a->ax_y1 = isfinite(ymax) ? ceil(log10(ymax)) : 1;
        if (a->ax_y1 <= a->ax_y0) {
            a->ax_y1 = a->ax_y0 + 1;
        }
        return;
    }
    ymax = isfinite(ymax) && ymax > 0 ? ymax * 1.08 : 1;
    *step_p = plot_nice_step(ymax);
    a->ax_y0 = 0;
    a->ax_y1 = ceil(ymax / *step_p) * *step_p;
}

static void
plot_frame(FILE *f, const bench_panel *p, const plot_axes *a, double step)
{
    double x = a->ax_x, y = a->ax_y, w = a->ax_w, h = a->ax_h;
    fprintf(f, "<g stroke=\"#ddd\" stroke-width=\"1\">\n");
    for (double t = a->ax_y0; t <= a->ax_y1 + step / 2; t += step) {
        double ty = y + h - (t - a->ax_y0) / (a->ax_y1 - a->ax_y0) * h;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n",
                x, ty, x + w, ty);
    }
    for (int e = (int)a->ax_x0; e <= (int)a->ax_x1; e++) {
        double tx = x + (e - a->ax_x0) / (a->ax_x1 - a->ax_x0) * w;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n",
                tx, y, tx, y + h);
    }
    fprintf(f, "</g>\n<g text-anchor=\"end\">\n");
    for (double t = a->ax_y0; t <= a->ax_y1 + step / 2; t += step) {
        double ty = y + h - (t - a->ax_y0) / (a->ax_y1 - a->ax_y0) * h;
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">%g</text>\n", x - 6, ty + 4,
                a->ax_log ? pow(10, t) : t);
    }
    fprintf(f, "</g>\n<g text-anchor=\"middle\">\n");
    int xspan = (int)(a->ax_x1 - a->ax_x0);
    int every = xspan > 10 ? (xspan + 9) / 10 : 1;
    for (int e = (int)a->ax_x0; e <= (int)a->ax_x1; e++) {
        if ((e - (int)a->ax_x0) % every != 0 || e < 0 || e > 62) {
            continue;
        }
        char sz[32];
        tool_format_size((uint64_t)1 << e, sz, sizeof(sz));
        double tx = x + (e - a->ax_x0) / (a->ax_x1 - a->ax_x0) * w;
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n", tx, y + h + 18,
                sz);
    }
    fprintf(f, "</g>\n");
    fprintf(f,
            "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
            "fill=\"none\" stroke=\"#333\"/>\n"
            "<text x=\"%.1f\" y=\"%.1f\" font-size=\"14\" "
            "text-anchor=\"middle\">",
            x, y, w, h, x + w / 2, y - 12);
    plot_text(f, p->pn_title);
    fprintf(f,
            "</text>\n<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">"
            "size, bytes (log2 scale; K, M = KiB, MiB)</text>\n"
            "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" "
            "transform=\"rotate(-90 %.1f %.1f)\">",
            x + w / 2, y + h + 40, x - 52, y + h / 2, x - 52, y + h / 2);
    plot_text(f, p->pn_ylabel);
    fprintf(f, "%s</text>\n", a->ax_log ? " (log scale)" : "");
}

// The ceilings: dashed lines across the plot, their labels right of it at
// the line's height (moved apart where two would overlap).
static void
plot_ceilings(FILE *f, const bench_panel *p, const plot_axes *a)
{
    double ly[8];
    size_t n = p->pn_nceils < 8 ? p->pn_nceils : 8;
    double last = -INFINITY;
    for (size_t c = 0; c < n; c++) {
        ly[c] = NAN;
    }
    // In order of height on the page, top first.
    for (size_t done = 0; done < n; done++) {
        size_t best = n;
        for (size_t c = 0; c < n; c++) {
            double v = p->pn_ceils[c].ce_value;
            if (isnan(ly[c]) && plot_visible(p, v) &&
                (best == n || v > p->pn_ceils[best].ce_value)) {
                best = c;
            }
        }
        if (best == n) {
            break;
        }
        double y = plot_py(a, p->pn_ceils[best].ce_value);
        ly[best] = fmax(y, last + PLOT_LABELH);
        last = ly[best];
    }
    for (size_t c = 0; c < n; c++) {
        const bench_ceiling *ce = &p->pn_ceils[c];
        if (isnan(ly[c])) {
            continue;
        }
        const char *col = c % 2 == 0 ? "#555" : "#999";
        double y = plot_py(a, ce->ce_value), x = a->ax_x + a->ax_w;
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                "stroke=\"%s\" stroke-width=\"1.5\" "
                "stroke-dasharray=\"6 4\"/>\n"
                "<text x=\"%.1f\" y=\"%.1f\" fill=\"%s\" font-size=\"11\">",
                a->ax_x, y, x + 4, ly[c], col, x + 8, ly[c] - 2, col);
        plot_text(f, ce->ce_name);
        fprintf(f, "<tspan x=\"%.1f\" dy=\"13\">%.2f %s</tspan></text>\n",
                x + 8, ce->ce_value, p->pn_unit);
    }
}

static void
plot_series(FILE *f, const bench_panel *p, const plot_axes *a, double ox,
            double legend_y)
{
    for (size_t s = 0; s < p->pn_nseries; s++) {
        const bench_series *se = &p->pn_series[s];
        const char *col = plot_colors[s % PLOT_NCOLORS];
        fprintf(f,
                "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" "
                "points=\"",
                col);
        for (size_t i = 0; i < se->se_n; i++) {
            if (plot_visible(p, se->se_y[i]) && se->se_x[i] > 0) {
                fprintf(f, "%.1f,%.1f ", plot_px(a, se->se_x[i]),
                        plot_py(a, se->se_y[i]));
            }
        }
        fprintf(f, "\"/>\n");
        for (size_t i = 0; i < se->se_n; i++) {
            if (plot_visible(p, se->se_y[i]) && se->se_x[i] > 0) {
                fprintf(f,
                        "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" "
                        "fill=\"%s\"><title>",
                        plot_px(a, se->se_x[i]), plot_py(a, se->se_y[i]), col);
                plot_text(f, se->se_name);
                fprintf(f, " %llu B: %.3f %s</title></circle>\n",
                        (unsigned long long)se->se_x[i], se->se_y[i],
                        p->pn_unit);
            }
        }
        // The legend, below the plot.
        double lx = ox + PLOT_L + (double)(s % PLOT_LCOLS) * 240;
        double ly = legend_y + (double)(s / PLOT_LCOLS) * PLOT_LROW;
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                "stroke=\"%s\" stroke-width=\"2\"/>\n"
                "<text x=\"%.1f\" y=\"%.1f\">",
                lx, ly, lx + 25, ly, col, lx + 31, ly + 4);
        plot_text(f, se->se_name);
        fprintf(f, "</text>\n");
    }
}

bool
bench_plot_svg(const char *path, const char *title, const bench_panel *panels,
               size_t npanels)
{
    size_t rows = 0;
    for (size_t k = 0; k < npanels; k++) {
        size_t r = (panels[k].pn_nseries + PLOT_LCOLS - 1) / PLOT_LCOLS;
        rows = r > rows ? r : rows;
    }
    double W = PLOT_W * (double)npanels;
    double legend_y = PLOT_T + PLOT_PH + PLOT_B + 12;
    double H = legend_y + (double)rows * PLOT_LROW + 10;
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        return false;
    }
    fprintf(f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" "
            "height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
            "font-family=\"sans-serif\" font-size=\"12\">\n<title>",
            W, H, W, H);
    plot_text(f, title);
    fprintf(f,
            "</title>\n<rect width=\"100%%\" height=\"100%%\" "
            "fill=\"white\"/>\n<text x=\"%.1f\" y=\"22\" font-size=\"15\" "
            "text-anchor=\"middle\">",
            W / 2);
    plot_text(f, title);
    fprintf(f, "</text>\n");
    for (size_t k = 0; k < npanels; k++) {
        const bench_panel *p = &panels[k];
        double ox = PLOT_W * (double)k, step;
        plot_axes a = {.ax_x = ox + PLOT_L,
                       .ax_y = PLOT_T,
                       .ax_w = PLOT_W - PLOT_L - PLOT_R,
                       .ax_h = PLOT_PH};
        plot_ranges(p, &a, &step);
        fprintf(f, "<g>\n");
        plot_frame(f, p, &a, step);
        plot_series(f, p, &a, ox, legend_y);
        plot_ceilings(f, p, &a);
        fprintf(f, "</g>\n");
    }
    fprintf(f, "</svg>\n");
    bool ok = !ferror(f);
    if (fclose(f) != 0) {
        return false;
    }
    if (!ok) {
        errno = EIO;
    }
    return ok;
}
