// SPDX-License-Identifier: Apache-2.0
// bench_pipe_plot.c - `tpipe bench pipe`'s output: the rows,
// the plot's ceilings (memcpy, loopback TCP) and its SVG.

#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <tpipe/pipe.h>

#include "bench_pipe.h"
#include "core/platform.h"
#include "tool.h"

// ---- ceilings for the plot -------------------------------------------------

// Single-thread memcpy of 256 MiB (as ../shared/peers/memcpy_bw.c): the
// median of 5 copies after a warm-up, GB/s of bytes copied.
double
bp_memcpy_gbps(void)
{
    size_t n = (size_t)256 << 20;
    uint8_t *src = bt_buf_alloc(n), *dst = bt_buf_alloc(n);
    double v[5];
    double res = NAN;
    if (src != NULL && dst != NULL) {
        memcpy(dst, src, n);
        for (int i = 0; i < 5; i++) {
            uint64_t t0 = tp__now_ns();
            memcpy(dst, src, n);
            __asm__ __volatile__("" ::: "memory");
            v[i] = (double)n / ((double)(tp__now_ns() - t0) / 1e9) / 1e9;
        }
        res = dst[n / 2] == src[n / 2] ? tool_median(v, 5) : NAN;
    }
    free(src);
    free(dst);
    return res;
}

typedef struct bp_sink {
    int bs_fd;
    uint64_t bs_bytes;
} bp_sink;

static void *
bp_sink_main(void *arg)
{
    bp_sink *s = arg;
    static uint8_t buf[128 << 10];
    for (;;) {
        ssize_t n = read(s->bs_fd, buf, sizeof(buf));
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            break;
        }
        s->bs_bytes += (uint64_t)n;
    }
    return NULL;
}

// A raw TCP stream over 127.0.0.1 for @secs (as iperf3 -P1: blocking 128
// KiB writes, one reader thread): GB/s received.
double
bp_tcp_gbps(double secs)
{
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int cfd = -1;
    bp_sink sink = {.bs_fd = -1};
    double res = NAN;
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
        listen(lfd, 1) != 0 ||
        getsockname(lfd, (struct sockaddr *)&sa, &sl) != 0) {
        goto out;
    }
    cfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (cfd < 0 || connect(cfd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        goto out;
    }
    sink.bs_fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (sink.bs_fd < 0) {
        goto out;
    }
    // A stuck reader must not hang the tool.
    struct timeval tv = {.tv_sec = 10};
    setsockopt(cfd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    setsockopt(sink.bs_fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    pthread_t th;
    if (pthread_create(&th, NULL, bp_sink_main, &sink) != 0) {
        goto out;
    }
    static uint8_t buf[128 << 10];
    memset(buf, 0x5a, sizeof(buf));
    uint64_t sent = 0, t0 = tp__now_ns();
    uint64_t end = t0 + (uint64_t)(secs * 1e9);
    bool ok = true;
    while (ok && tp__now_ns() < end) {
        ssize_t n = write(cfd, buf, sizeof(buf));
        ok = n > 0 || (n < 0 && errno == EINTR);
        sent += n > 0 ? (uint64_t)n : 0;
    }
    shutdown(cfd, SHUT_WR);
    pthread_join(th, NULL);
    uint64_t t1 = tp__now_ns();
    if (ok && sink.bs_bytes == sent) {
        res = (double)sent / ((double)(t1 - t0) / 1e9) / 1e9;
    }
out:
    if (sink.bs_fd >= 0) {
        close(sink.bs_fd);
    }
    if (cfd >= 0) {
        close(cfd);
    }
    if (lfd >= 0) {
        close(lfd);
    }
    return res;
}

// ---- output ----------------------------------------------------------------

void
bp_print_header(const bp_opts *o)
{
    if (o->bo_com.bo_json) {
        return;
    }
    printf("%-9s  %-7s  %-6s  %-8s  ", "transport", "channel", "mode", "test");
    bench_print_header_stats();
    fflush(stdout);
}

// Prints one cell; returns the median GB/s.
double
bp_print_cell(const bp_opts *o, const bp_combo *cb, const char *tr,
              const char *test, uint64_t size, bench_cell *cell)
{
    bench_medians m;
    if (!bench_cell_medians(cell, &m)) {
        return NAN;
    }
    const char *mode = cb->bc_inproc ? "thread" : "proc";
    if (o->bo_com.bo_json) {
        printf("{\"bench\":\"pipe\",\"transport\":");
        tool_json_str(stdout, tr);
        printf(",\"channel\":");
        tool_json_str(stdout, cb->bc_channel);
        printf(",\"mode\":\"%s\",\"test\":\"%s\",\"size\":%llu,"
               "\"payloads\":%u,\"payload_size\":%llu,",
               mode, test, (unsigned long long)size, o->bo_npayloads,
               (unsigned long long)o->bo_payload_size);
        bench_print_json_stats(&m);
        printf(",\"iters\":%llu,\"reps\":%u}\n",
               (unsigned long long)cell->bc_iters, cell->bc_n);
    } else {
        printf("%-9s  %-7s  %-6s  %-8s  ", tr, cb->bc_channel, mode, test);
        bench_print_row_stats(size, &m, cell->bc_iters);
    }
    fflush(stdout);
    return m.bm_gbps;
}

static const char *const bp_colors[] = {
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
    "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f",
};

// A round step for about 6 ticks up to @max.
static double
bp_nice_step(double max)
{
    double raw = max / 6, p = pow(10, floor(log10(raw)));
    double m = raw / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
}

// Stream GB/s against log2(size), one polyline per combination, and the
// two ceilings as dashed lines. Returns false (with errno) if the file
// cannot be written.
bool
bp_write_svg(const bp_opts *o, const bp_result *res, size_t nres,
             double memcpy_gbps, double tcp_gbps)
{
    FILE *f = fopen(o->bo_plot, "w");
    if (f == NULL) {
        return false;
    }
    const double W = 900, H = 540, L = 70, R = 210, T = 40, B = 60;
    const double pw = W - L - R, ph = H - T - B;
    uint64_t smin = o->bo_com.bo_sizes[0], smax = o->bo_com.bo_sizes[0];
    for (size_t i = 0; i < o->bo_com.bo_nsizes; i++) {
        smin = o->bo_com.bo_sizes[i] < smin ? o->bo_com.bo_sizes[i] : smin;
        smax = o->bo_com.bo_sizes[i] > smax ? o->bo_com.bo_sizes[i] : smax;
    }
    double x0 = floor(log2((double)smin)), x1 = ceil(log2((double)smax));
    if (x1 <= x0) {
        x0 -= 1;
        x1 += 1;
    }
    double ymax = 0;
    for (size_t k = 0; k < nres; k++) {
        for (size_t i = 0; res[k].pr_ok && i < o->bo_com.bo_nsizes; i++) {
            double v = res[k].pr_stream_gbps[i];
            ymax = isfinite(v) && v > ymax ? v : ymax;
        }
    }
    ymax = isfinite(memcpy_gbps) && memcpy_gbps > ymax ? memcpy_gbps : ymax;
    ymax = isfinite(tcp_gbps) && tcp_gbps > ymax ? tcp_gbps : ymax;
    ymax = ymax > 0 ? ymax * 1.08 : 1;
    double ystep = bp_nice_step(ymax);
    ymax = ceil(ymax / ystep) * ystep;
#define BP_X(s) (L + (log2((double)(s)) - x0) / (x1 - x0) * pw)
#define BP_Y(v) (T + ph - (v) / ymax * ph)

    fprintf(f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" "
            "height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
            "font-family=\"sans-serif\" font-size=\"12\">\n"
            "<title>tpipe bench pipe: stream bandwidth</title>\n"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
            "<text x=\"%.1f\" y=\"22\" font-size=\"15\" "
            "text-anchor=\"middle\">tpipe bench pipe: stream, one tensor "
            "per message (median of %u rep%s, window %u)</text>\n",
            W, H, W, H, L + pw / 2, o->bo_com.bo_reps,
            o->bo_com.bo_reps == 1 ? "" : "s", o->bo_com.bo_window);
    // Grid, ticks and labels.
    fprintf(f, "<g stroke=\"#ddd\" stroke-width=\"1\">\n");
    for (double y = 0; y <= ymax + ystep / 2; y += ystep) {
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n",
                L, BP_Y(y), L + pw, BP_Y(y));
    }
    int xspan = (int)(x1 - x0), every = xspan > 12 ? (xspan + 11) / 12 : 1;
    for (int e = (int)x0; e <= (int)x1; e++) {
        double x = L + (e - x0) / (x1 - x0) * pw;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n",
                x, T, x, T + ph);
    }
    fprintf(f, "</g>\n<g text-anchor=\"end\">\n");
    for (double y = 0; y <= ymax + ystep / 2; y += ystep) {
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">%g</text>\n", L - 6,
                BP_Y(y) + 4, y);
    }
    fprintf(f, "</g>\n<g text-anchor=\"middle\">\n");
    for (int e = (int)x0; e <= (int)x1; e++) {
        if ((e - (int)x0) % every != 0 || e < 0 || e > 62) {
            continue;
        }
        char sz[32];
        tool_format_size((uint64_t)1 << e, sz, sizeof(sz));
        double x = L + (e - x0) / (x1 - x0) * pw;
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n", x, T + ph + 18,
                sz);
    }
    fprintf(f, "</g>\n");
    fprintf(f,
            "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
            "fill=\"none\" stroke=\"#333\"/>\n"
            "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">tensor size, "
            "bytes (log2 scale; K, M = KiB, MiB)</text>\n"
            "<text x=\"18\" y=\"%.1f\" text-anchor=\"middle\" "
            "transform=\"rotate(-90 18 %.1f)\">GB/s (1e9 B/s), one "
            "way</text>\n",
            L, T, pw, ph, L + pw / 2, H - 16, T + ph / 2, T + ph / 2);
    // Ceilings.
    struct {
        const char *name, *color;
        double v;
    } ceil_[2] = {{"memcpy 256 MiB, 1 thread", "#555", memcpy_gbps},
                  {"loopback TCP, 1 stream", "#999", tcp_gbps}};
    for (int i = 0; i < 2; i++) {
        if (isfinite(ceil_[i].v)) {
            double y = BP_Y(ceil_[i].v);
            fprintf(f,
                    "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                    "stroke=\"%s\" stroke-width=\"1.5\" "
                    "stroke-dasharray=\"6 4\"/>\n",
                    L, y, L + pw, y, ceil_[i].color);
        }
    }
    // One polyline per combination, and the legend.
    double ly = T + 10;
    for (size_t k = 0; k < nres; k++) {
        if (!res[k].pr_ok) {
            continue;
        }
        const char *col = bp_colors[k % TP_ARRAY_LEN(bp_colors)];
        fprintf(f,
                "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" "
                "points=\"",
                col);
        for (size_t i = 0; i < o->bo_com.bo_nsizes; i++) {
            double v = res[k].pr_stream_gbps[i];
            if (isfinite(v)) {
                fprintf(f, "%.1f,%.1f ", BP_X(o->bo_com.bo_sizes[i]), BP_Y(v));
            }
        }
        fprintf(f, "\"/>\n");
        for (size_t i = 0; i < o->bo_com.bo_nsizes; i++) {
            double v = res[k].pr_stream_gbps[i];
            if (isfinite(v)) {
                fprintf(f,
                        "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" "
                        "fill=\"%s\"><title>%s+%s %llu B: %.3f "
                        "GB/s</title></circle>\n",
                        BP_X(o->bo_com.bo_sizes[i]), BP_Y(v), col,
                        res[k].pr_transport, res[k].pr_combo->bc_channel,
                        (unsigned long long)o->bo_com.bo_sizes[i], v);
            }
        }
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                "stroke=\"%s\" stroke-width=\"2\"/>\n"
                "<text x=\"%.1f\" y=\"%.1f\">%s+%s%s</text>\n",
                W - R + 15, ly, W - R + 40, ly, col, W - R + 46, ly + 4,
                res[k].pr_transport, res[k].pr_combo->bc_channel,
                res[k].pr_combo->bc_inproc ? " (1 process)" : "");
        ly += 18;
    }
    // The ceilings' labels last, with a halo, over the curves.
    for (int i = 0; i < 2; i++) {
        if (isfinite(ceil_[i].v)) {
            fprintf(f,
                    "<text x=\"%.1f\" y=\"%.1f\" fill=\"%s\" "
                    "stroke=\"white\" stroke-width=\"3\" "
                    "paint-order=\"stroke\">%s: %.2f GB/s</text>\n",
                    L + 6, BP_Y(ceil_[i].v) - 4, ceil_[i].color, ceil_[i].name,
                    ceil_[i].v);
        }
    }
    fprintf(f, "</svg>\n");
#undef BP_X
#undef BP_Y
    bool ok = !ferror(f);
    return fclose(f) == 0 && ok;
}
