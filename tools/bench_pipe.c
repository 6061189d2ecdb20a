// SPDX-License-Identifier: Apache-2.0
// bench_pipe.c - `tpipe bench pipe`: round-trip latency and one-way
// streaming bandwidth of pipe messages (one tensor of SIZE bytes, plus
// optional payloads), per transport and channel combination.
//
// For each combination and each repetition, a server child is forked
// before this process creates any context (fork with threads is unsafe);
// the child creates a context restricted to the combination, listens on
// loopback and sends the listener's URL back through a pipe(2); this
// process creates its own context with the same allow lists, connects and
// checks (tp_pipe_transport / tp_pipe_channel) that the pipe negotiated
// the combination asked for. The xth channel only works inside one
// process: its combinations run both contexts here ("thread" mode), after
// every forked one. Every measurement is chained in aio callbacks on the
// contexts' loop threads (as tools/bench_peer.c does for bench transport);
// the main thread starts it and waits with a stall deadline.
//
// Messages (metadata is one byte):
//   'P' ping: the server echoes the tensor and payloads back as 'R';
//   'S' stream: the server sinks it; 'A' the last stream message: sunk,
//   then acked with an empty 'K'; 'Q' quit: acked with 'K', then the server
//   tears down and exits.

#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <tpipe/info.h>
#include <tpipe/pipe.h>
#include <tpipe/store.h>

#include "bench_pipe.h"
#include "core/platform.h"
#include "tool.h"

// ---- across hosts ----------------------------------------------------------

#define BP_STORE_KEY "tpipe/bench_pipe/url"

// The key of the URL that pair @pair's server publishes: one pair but
// for a launched msgrate run (OSU's osu_mbw_mr: pair p is ranks p and
// p + P).
static void
bp_url_key(const bp_opts *o, int pair, char *key, size_t len)
{
    if (o->bo_msgrate) {
        snprintf(key, len, BP_STORE_KEY "/%d", pair);
    } else {
        snprintf(key, len, "%s", BP_STORE_KEY);
    }
}

static int64_t
bp_wait_ms(const bp_opts *o)
{
    return (int64_t)(o->bo_com.bo_stall_s * 2000);
}

// The launched job's store (TP_INIT_METHOD, default env://), or NULL with
// the error printed.
static tp_store *
bp_store_open(const bp_opts *o)
{
    const char *im = getenv("TP_INIT_METHOD");
    tp_store *st = NULL;
    tp_error *err = NULL;
    if (tp_store_open(im && *im ? im : "env://", o->bo_rank, o->bo_world,
                      bp_wait_ms(o), &st, &err) != TP_OK) {
        tool_err("bench pipe: rank %d: store: %s", o->bo_rank,
                 tp_error_message(err));
        tp_error_unref(err);
        return NULL;
    }
    return st;
}

// --listen, or rank 1 of a launched job: serves one client, then exits.
// The URL goes to stdout (--listen) or into the job's store (launched).
static int
bp_serve(const bp_opts *o)
{
    const bp_combo *c = &o->bo_combos[0];
    static bp_server srv;
    tp_context *ctx = NULL;
    char url[512], why[1024];
    int rc = TOOL_EXIT_FAIL;
    tp_store *st = NULL;
    if (o->bo_launched && (st = bp_store_open(o)) == NULL) {
        return TOOL_EXIT_FAIL;
    }
    bp_outcome out =
        bp_server_setup(o, c, &ctx, &srv, url, sizeof(url), why, sizeof(why));
    if (out != BP_OK) {
        tool_err("bench pipe: %s: %s", c->bc_label, why);
        goto done;
    }
    if (st != NULL) {
        tp_error *err = NULL;
        char key[64];
        bp_url_key(o, o->bo_rank - o->bo_world / 2, key, sizeof(key));
        if (tp_store_set(st, key, url, strlen(url), bp_wait_ms(o), &err) !=
            TP_OK) {
            tool_err("bench pipe: rank %d: publishing %s: %s", o->bo_rank, url,
                     tp_error_message(err));
            tp_error_unref(err);
            goto done;
        }
        tool_verbose(o->bo_com.bo_verbose, "bench pipe",
                     "rank %d: serving %s on %s", o->bo_rank, c->bc_label, url);
    } else {
        printf("%s\n", url);
        fflush(stdout);
    }
    // The client drives; no client, or one that stopped talking, for two
    // stall timeouts ends the server.
    int wrc = bt_sync_wait(&srv.sv_sync, bench_stall_ns(&o->bo_com) * 2);
    if (wrc != 0) {
        tool_err("bench pipe: server (%s): %s", c->bc_label,
                 wrc == -2 ? "no progress (no client, or it stopped), "
                             "giving up"
                           : srv.sv_sync.bs_msg);
        tool_install_teardown_alarm("bench pipe",
                                    (unsigned)o->bo_com.bo_stall_s + 10);
        goto done;
    }
    rc = TOOL_EXIT_OK;
done:
    bp_server_teardown(ctx, &srv);
    alarm(0);
    tp_store_close(st);
    return rc;
}

// --connect, or rank 0 of a launched job: the URL to measure against
// (from the store: rank 1 publishes it), into @url.
static bool
bp_client_url(const bp_opts *o, tp_store **st_p, char *url, size_t len)
{
    if (o->bo_connect != NULL) {
        snprintf(url, len, "%s", o->bo_connect);
        return true;
    }
    if ((*st_p = bp_store_open(o)) == NULL) {
        return false;
    }
    void *val = NULL;
    size_t n = 0;
    tp_error *err = NULL;
    char key[64];
    bp_url_key(o, o->bo_rank, key, sizeof(key));
    if (tp_store_get(*st_p, key, bp_wait_ms(o), &val, &n, &err) != TP_OK) {
        tool_err("bench pipe: rank %d: waiting for rank %d's URL: %s",
                 o->bo_rank, o->bo_rank + o->bo_world / 2,
                 tp_error_message(err));
        tp_error_unref(err);
        return false;
    }
    snprintf(url, len, "%.*s", (int)n, (const char *)val);
    tp_free(val);
    tool_verbose(o->bo_com.bo_verbose, "bench pipe", "rank %d: server at %s",
                 o->bo_rank, url);
    return true;
}

// ---- main ------------------------------------------------------------------

// One combination's rows, printed as each cell's last repetition is
// recorded (bench_opts.bo_done_fn).
typedef struct bp_done {
    bench_out *pd_out;
    const bp_opts *pd_opts;
    const bp_run *pd_run;
    bp_result *pd_res;
} bp_done;

static void
bp_done_cb(void *arg, bench_cell *cell)
{
    bp_done *d = arg;
    size_t i = cell->bc_index % d->pd_opts->bo_com.bo_nsizes;
    double g =
        bp_print_cell(d->pd_out, d->pd_opts, d->pd_run->pr_combo,
                      d->pd_run->pr_transport, d->pd_run->pr_dchannel, cell);
    (cell->bc_stream ? d->pd_res->pr_stream_gbps : d->pd_res->pr_p50_us)[i] = g;
}

int
tool_bench_pipe_main(int argc, char **argv)
{
    bp_opts o;
    int rc = bp_parse_args(argc, argv, &o);
    if (rc >= 0) {
        return rc;
    }
    // A write to a dead peer must be an error, not a signal.
    signal(SIGPIPE, SIG_IGN);
    // Launched: ranks 0..P-1 measure against P..2P-1 (P = 1 but for
    // msgrate), rank 0 prints the rows.
    if (o.bo_listen || (o.bo_launched && o.bo_rank >= o.bo_world / 2)) {
        return bp_serve(&o);
    }
    static char remote_url[1024];
    tp_store *store = NULL;
    bool remote = o.bo_connect != NULL || o.bo_launched;
    if (remote && !bp_client_url(&o, &store, remote_url, sizeof(remote_url))) {
        tp_store_close(store);
        return TOOL_EXIT_FAIL;
    }
    if (o.bo_launched && o.bo_msgrate && o.bo_rank > 0) {
        // A pair of the job but the first: measures, hands its rates to
        // rank 0 through the store.
        rc = bp_msgrate_pair(&o, store, remote_url);
        tp_store_close(store);
        return rc;
    }

    // Shared: with --device cuda, each local repetition runs in a forked
    // child (bp_run_rep_isolated) that records into them.
    size_t ncells = 2 * o.bo_com.bo_nsizes;
    size_t cells_len = ncells * sizeof(bench_cell);
    size_t vals_len = ncells * 4 * o.bo_com.bo_reps * sizeof(double);
    bench_cell *cells = bp_shared_alloc(cells_len);
    double *vals = bp_shared_alloc(vals_len);
    bp_result *res = calloc(o.bo_ncombos, sizeof(*res));
    double *gbps =
        calloc(2 * o.bo_ncombos * o.bo_com.bo_nsizes, sizeof(double));
    if (cells == NULL || vals == NULL || res == NULL || gbps == NULL) {
        tool_err("out of memory");
        bp_shared_free(cells, cells_len);
        bp_shared_free(vals, vals_len);
        free(res);
        free(gbps);
        return TOOL_EXIT_FAIL;
    }
    bench_out rows;
    bp_out_init(&o, &rows);
    bool failed = false;
    size_t measured = 0;
    for (size_t ci = 0; ci < o.bo_ncombos; ci++) {
        const bp_combo *cb = &o.bo_combos[ci];
        bp_result *pr = &res[ci];
        pr->pr_combo = cb;
        pr->pr_stream_gbps = gbps + ci * o.bo_com.bo_nsizes;
        pr->pr_p50_us = gbps + (o.bo_ncombos + ci) * o.bo_com.bo_nsizes;
        for (size_t i = 0; i < o.bo_com.bo_nsizes; i++) {
            pr->pr_stream_gbps[i] = pr->pr_p50_us[i] = NAN;
        }
        // A transport that cannot work here is skipped before forking.
        if (!bench_viable("bench pipe", cb->bc_label, TOOL_TRANSPORT,
                          cb->bc_connect) ||
            !bench_viable("bench pipe", cb->bc_label, TOOL_CHANNEL,
                          cb->bc_channel)) {
            continue;
        }
        bench_cells_reset(&o.bo_com, cells, vals);
        static bp_run r;
        memset(&r, 0, sizeof(r));
        r.pr_opts = &o;
        r.pr_combo = cb;
        bp_done done = {&rows, &o, &r, pr};
        o.bo_com.bo_done_fn = bp_done_cb;
        o.bo_com.bo_done_arg = &done;
        bp_outcome out = BP_OK;
        if (o.bo_msgrate && o.bo_launched) {
            out = bp_msgrate_launched(&r, store, remote_url, cells);
        } else if (o.bo_msgrate) {
            out = bp_msgrate(&r, cells);
        }
        for (unsigned rep = 0;
             rep < o.bo_com.bo_reps && out == BP_OK && !o.bo_msgrate; rep++) {
            tool_verbose(o.bo_com.bo_verbose, "bench pipe",
                         "%s: repetition %u of %u", cb->bc_label, rep + 1,
                         o.bo_com.bo_reps);
            out = remote      ? bp_run_remote(&r, remote_url, cells)
                  : o.bo_cuda ? bp_run_rep_isolated(&o, &r, cells)
                              : bp_run_rep(&r, cells);
        }
        if (out == BP_SKIP) {
            bench_skip("bench pipe", cb->bc_label, "%s", r.pr_err);
            continue;
        }
        if (out == BP_FAIL) {
            fflush(stdout);
            tool_err("bench pipe: %s: %s", cb->bc_label, r.pr_err);
            failed = true;
            continue;
        }
        measured++;
        pr->pr_ok = true;
        snprintf(pr->pr_transport, sizeof(pr->pr_transport), "%s",
                 r.pr_transport);
    }
    o.bo_com.bo_done_fn = NULL;
    // After every fork: the first CUDA call of this process.
    if (o.bo_cuda && measured > 0 && !bp_dev_baseline(&o, &rows)) {
        failed = true;
    }
    if (o.bo_plot != NULL) {
        // After every fork: the TCP ceiling starts a thread.
        double mc = bp_memcpy_gbps();
        double tc = bp_tcp_gbps(1.0);
        if (!bp_write_svg(&o, res, o.bo_ncombos, mc, tc)) {
            tool_err("bench pipe: cannot write %s: %s", o.bo_plot,
                     strerror(errno));
            failed = true;
        } else {
            char a[32], b[32];
            tool_fmt_num(a, sizeof(a), mc, 2);
            tool_fmt_num(b, sizeof(b), tc, 2);
            fprintf(o.bo_com.bo_json ? stderr : stdout,
                    "%sceilings: memcpy %s GB/s, loopback TCP %s GB/s; plot "
                    "written to %s\n",
                    o.bo_com.bo_json ? "tpipe: bench pipe: " : "", a, b,
                    o.bo_plot);
        }
    }
    if (measured == 0 && !failed) {
        tool_err("bench pipe: no combination could be measured here");
        failed = true;
    }
    tp_store_close(store);
    bp_shared_free(cells, cells_len);
    bp_shared_free(vals, vals_len);
    free(res);
    free(gbps);
    return failed ? TOOL_EXIT_FAIL : TOOL_EXIT_OK;
}
