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
#include "bench_out.h"
#include "bench_plot.h"
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

// The table's device column is there with --device cuda only (bp_out_init);
// JSON always has device_src and device_dst (at the end: the keys before
// them are those of earlier versions).
#define BP_COL_DEVICE 3
static bench_col bp_cols[] = {
    {"transport", -9, "transport", BENCH_COL_STR, 0},
    {"channel", -7, "channel", BENCH_COL_STR, 0},
    {"mode", -6, "mode", BENCH_COL_STR, 0},
    {"device", -14, NULL, BENCH_COL_STR, 0},
    {"test", -8, "test", BENCH_COL_STR, 0},
    {NULL, 0, "payloads", BENCH_COL_U64, 0},
    {NULL, 0, "payload_size", BENCH_COL_U64, 0},
    BENCH_OUT_STATS_COLS,
    {"iters", 8, "iters", BENCH_COL_U64, 0},
    {NULL, 0, "reps", BENCH_COL_U64, 0},
    {NULL, 0, "pairs", BENCH_COL_U64, 0},
    {"Mmsg/s", 9, "msgs_per_s", BENCH_COL_NUM, -1},
    {NULL, 0, "device_src", BENCH_COL_STR, 0},
    {NULL, 0, "device_dst", BENCH_COL_STR, 0},
    // --device cuda: the pipe's device channel ("" = staged through host
    // memory on the pipe's channel); hidden otherwise (bp_out_init).
    {"dchannel", -8, "device_channel", BENCH_COL_STR, 0},
};
#define BP_COL_DCHANNEL (TP_ARRAY_LEN(bp_cols) - 1)

// The device values of a row: "cuda:0->cpu" and its two halves.
typedef struct bp_dev_strs {
    char ds_pair[40], ds_src[16], ds_dst[16];
} bp_dev_strs;

static void
bp_dev_strs_of(tp_device src, tp_device dst, bp_dev_strs *d)
{
    bp_dev_name(src, d->ds_src, sizeof(d->ds_src));
    bp_dev_name(dst, d->ds_dst, sizeof(d->ds_dst));
    snprintf(d->ds_pair, sizeof(d->ds_pair), "%s->%s", d->ds_src, d->ds_dst);
}

void
bp_out_init(const bp_opts *o, bench_out *out)
{
    bp_cols[BP_COL_DEVICE].col_width = o->bo_cuda ? -14 : 0;
    bp_cols[BP_COL_DCHANNEL].col_width = o->bo_cuda ? -8 : 0;
    bench_out_init(out, "pipe", bp_cols, TP_ARRAY_LEN(bp_cols),
                   o->bo_com.bo_json);
}

double
bp_print_cell(bench_out *out, const bp_opts *o, const bp_combo *cb,
              const char *tr, const char *dch, bench_cell *cell)
{
    bench_medians m;
    if (!bench_cell_medians(cell, &m)) {
        return NAN;
    }
    double msg =
        (double)cell->bc_size + (double)o->bo_npayloads * o->bo_payload_size;
    double rate = m.bm_gbps * 1e9 / msg;
    bp_dev_strs d;
    bp_dev_strs_of(o->bo_src, o->bo_dst, &d);
    const bench_val v[TP_ARRAY_LEN(bp_cols)] = {
        {.v_str = tr},
        {.v_str = cb->bc_channel},
        {.v_str = cb->bc_inproc   ? "thread"
                  : cb->bc_remote ? "remote"
                                  : "proc"},
        {.v_str = d.ds_pair},
        {.v_str = !cell->bc_stream ? "pingpong"
                  : o->bo_msgrate  ? "msgrate"
                  : o->bo_bibw     ? "bibw"
                                   : "stream"},
        {.v_u64 = o->bo_npayloads},
        {.v_u64 = o->bo_payload_size},
        {.v_u64 = cell->bc_size},
        {.v_num = m.bm_p50},
        {.v_num = m.bm_p90},
        {.v_num = m.bm_p99},
        {.v_num = m.bm_gbps},
        {.v_u64 = cell->bc_iters},
        {.v_u64 = cell->bc_n},
        {.v_u64 = o->bo_msgrate ? o->bo_pairs : 1},
        // The table: millions of messages per second; JSON: messages/s.
        {.v_num = o->bo_msgrate ? rate / (o->bo_com.bo_json ? 1.0 : 1e6) : NAN,
         .v_prec = o->bo_com.bo_json ? 0 : 3},
        {.v_str = d.ds_src},
        {.v_str = d.ds_dst},
        {.v_str = o->bo_cuda ? (*dch ? dch : "staged") : NULL},
    };
    bench_out_row(out, v);
    return cell->bc_stream ? m.bm_gbps : m.bm_p50;
}

void
bp_print_copy(bench_out *out, const bp_opts *o, const char *test, tp_device src,
              tp_device dst, uint64_t size, double gbps, uint64_t iters,
              unsigned reps)
{
    bp_dev_strs d;
    bp_dev_strs_of(src, dst, &d);
    const bench_val v[TP_ARRAY_LEN(bp_cols)] = {
        {.v_str = NULL},
        {.v_str = NULL},
        {.v_str = "copy"},
        {.v_str = d.ds_pair},
        {.v_str = test},
        {.v_u64 = 0},
        {.v_u64 = 0},
        {.v_u64 = size},
        {.v_num = NAN},
        {.v_num = NAN},
        {.v_num = NAN},
        {.v_num = gbps},
        {.v_u64 = iters},
        {.v_u64 = reps},
        {.v_u64 = 1},
        {.v_num = NAN, .v_prec = o->bo_com.bo_json ? 0 : 3},
        {.v_str = d.ds_src},
        {.v_str = d.ds_dst},
        {.v_str = NULL},
    };
    bench_out_row(out, v);
}

// Stream GB/s against size, one curve per combination, with the two
// ceilings; and, when pingpong was measured, its p50 beside it.
bool
bp_write_svg(const bp_opts *o, const bp_result *res, size_t nres,
             double memcpy_gbps, double tcp_gbps)
{
    const bench_opts *c = &o->bo_com;
    bench_series *bw = calloc(nres + 1, sizeof(*bw));
    bench_series *lat = calloc(nres + 1, sizeof(*lat));
    char(*names)[64] = calloc(nres + 1, sizeof(*names));
    if (bw == NULL || lat == NULL || names == NULL) {
        free(bw);
        free(lat);
        free(names);
        errno = ENOMEM;
        return false;
    }
    size_t n = 0;
    for (size_t k = 0; k < nres; k++) {
        if (!res[k].pr_ok) {
            continue;
        }
        snprintf(names[n], sizeof(names[n]), "%s+%s%s", res[k].pr_transport,
                 res[k].pr_combo->bc_channel,
                 res[k].pr_combo->bc_inproc ? " (1 process)" : "");
        bw[n] = (bench_series){names[n], c->bo_sizes, res[k].pr_stream_gbps,
                               c->bo_nsizes};
        lat[n] = (bench_series){names[n], c->bo_sizes, res[k].pr_p50_us,
                                c->bo_nsizes};
        n++;
    }
    const bench_ceiling ceils[2] = {{"memcpy 256 MiB, 1 thread", memcpy_gbps},
                                    {"loopback TCP, 1 stream", tcp_gbps}};
    const bench_panel panels[2] = {
        {.pn_title = "stream, one tensor per message",
         .pn_ylabel = "GB/s (1e9 B/s), one way",
         .pn_unit = "GB/s",
         .pn_series = bw,
         .pn_nseries = n,
         .pn_ceils = ceils,
         .pn_nceils = 2},
        {.pn_title = "pingpong, round trip p50",
         .pn_ylabel = "round trip p50, us",
         .pn_unit = "us",
         .pn_logy = true,
         .pn_series = lat,
         .pn_nseries = n},
    };
    char title[160];
    snprintf(title, sizeof(title),
             "tpipe bench pipe (median of %u rep%s, window %u)", c->bo_reps,
             c->bo_reps == 1 ? "" : "s", c->bo_window);
    bool ok = bench_plot_svg(o->bo_plot, title, panels, c->bo_pingpong ? 2 : 1);
    int e = errno;
    free(bw);
    free(lat);
    free(names);
    errno = e;
    return ok;
}
