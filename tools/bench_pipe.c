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

static const bench_usage bp_usage = {
    .bu_head =
        "usage: tpipe bench pipe [options]\n"
        "\n"
        "Pipe messages of one tensor of SIZE bytes (plus --payloads) between "
        "two\n"
        "contexts: a forked server process and this one (xth: two contexts in "
        "this\n"
        "process). pingpong: this side writes a message, the server reads it "
        "into a\n"
        "preallocated buffer and writes it back; round trip p50/p90/p99 in "
        "us.\n"
        "stream: W writes in flight; GB/s = bytes / time until the server's "
        "ack\n"
        "(1 GB = 1e9 B).\n",
    .bu_tail =
        "JSON line: {\"bench\":\"pipe\",\"transport\":\"tcp\",\"channel\":"
        "\"basic\",\"mode\":\"proc\",\n"
        "  \"test\":\"pingpong\",\"size\":64,\"payloads\":0,"
        "\"payload_size\":0,\"p50_us\":..,\"p90_us\":..,\n"
        "  \"p99_us\":..,\"gbps\":null,\"iters\":..,\"reps\":1}\n"
        "(latency fields null for stream, gbps null for pingpong).\n",
};

_Static_assert(BP_MAX_PAYLOADS == 64 && BP_MAX_PAYLOAD == 64u << 20,
               "the usage says these numbers");

// ---- options ---------------------------------------------------------------

// Splits a comma list into @names (pointers into @buf).
static bool
bp_split(const char *what, char *buf, const char **names, size_t *n_p)
{
    *n_p = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        if (*n_p == BP_MAX_NAMES) {
            tool_err("bench pipe: too many %ss", what);
            return false;
        }
        names[(*n_p)++] = tok;
    }
    if (*n_p == 0) {
        tool_err("bench pipe: --%s is empty", what);
        return false;
    }
    return true;
}

// --transport and --channel: names compiled in (tpipe/info.h); "all" is
// every viable one, best first (the others are reported as skipped).
static bool
bp_parse_names(const char *what, tool_backend_kind kind, const char *list,
               char *buf, size_t buf_len, const char **names, size_t *n_p,
               bool *all_p)
{
    *all_p = strcmp(list, "all") == 0;
    if (*all_p) {
        *n_p = bench_backends("bench pipe", kind, true, names, BP_MAX_NAMES);
        if (*n_p == 0) {
            tool_err("bench pipe: no %s is viable here", what);
            return false;
        }
        return true;
    }
    snprintf(buf, buf_len, "%s", list);
    if (!bp_split(what, buf, names, n_p)) {
        return false;
    }
    for (size_t i = 0; i < *n_p; i++) {
        if (!tool_backend_known(kind, names[i])) {
            tool_backend_unknown("bench pipe", kind, names[i], "all");
            return false;
        }
    }
    return true;
}

static void
bp_add_combo(bp_opts *o, const char *transports, const char *connect,
             const char *expect, const char *channel, bool inproc)
{
    if (o->bo_ncombos == BP_MAX_COMBOS) {
        return;
    }
    bp_combo *c = &o->bo_combos[o->bo_ncombos++];
    snprintf(c->bc_transports, sizeof(c->bc_transports), "%s", transports);
    snprintf(c->bc_connect, sizeof(c->bc_connect), "%s", connect);
    snprintf(c->bc_expect, sizeof(c->bc_expect), "%s", expect);
    snprintf(c->bc_channel, sizeof(c->bc_channel), "%s", channel);
    c->bc_inproc = inproc;
    if (*expect == '\0') {
        snprintf(c->bc_label, sizeof(c->bc_label), "%s (%s)", channel,
                 transports);
    } else {
        snprintf(c->bc_label, sizeof(c->bc_label), "%s+%s", expect, channel);
    }
}

// Every (transport, channel) pair; xth runs in this process, after the
// forked combinations. mpt's lanes are TCP connections: its contexts also
// allow tcp (the pipe itself must still choose the transport asked for).
// With every transport and channel (the default), mpt over a same-host
// transport (shm) is left out (the pipe prefers that memory to tcp lanes:
// ask for it with --transport shm --channel mpt to see its refusal), and
// xth is one combination that allows every transport and dials the last
// (least preferred), so that the handshake may upgrade to the best.
// Whether transport @name connects one host's processes only (shm): the
// public introspection API's answer.
static bool
bp_same_host(const char *name)
{
    tp_backend_info tr[TP_INFO_MAX];
    size_t n = 0;
    if (tp_info_transports(0, tr, TP_INFO_MAX, &n, NULL) != TP_OK) {
        return false;
    }
    for (size_t i = 0; i < n && i < TP_INFO_MAX; i++) {
        if (strcmp(tr[i].name, name) == 0) {
            return tr[i].same_host;
        }
    }
    return false;
}

static void
bp_make_combos(bp_opts *o)
{
    bool all = o->bo_all_transports && o->bo_all_channels;
    for (size_t ti = 0; ti < o->bo_ntransports; ti++) {
        for (size_t ci = 0; ci < o->bo_nchannels; ci++) {
            const char *t = o->bo_transports[ti], *c = o->bo_channels[ci];
            bool mpt = strcmp(c, "mpt") == 0;
            if (strcmp(c, "xth") == 0 || (all && mpt && bp_same_host(t))) {
                continue;
            }
            char allow[64];
            snprintf(allow, sizeof(allow), "%s%s", t,
                     mpt && strcmp(t, "tcp") != 0 ? ",tcp" : "");
            bp_add_combo(o, allow, t, t, c, false);
        }
    }
    for (size_t ci = 0; ci < o->bo_nchannels; ci++) {
        if (strcmp(o->bo_channels[ci], "xth") != 0) {
            continue;
        }
        if (o->bo_all_transports) {
            char allow[64] = "";
            size_t off = 0;
            for (size_t ti = 0; ti < o->bo_ntransports && off < sizeof(allow);
                 ti++) {
                off +=
                    (size_t)snprintf(allow + off, sizeof(allow) - off, "%s%s",
                                     ti ? "," : "", o->bo_transports[ti]);
            }
            bp_add_combo(o, allow, o->bo_transports[o->bo_ntransports - 1], "",
                         "xth", true);
        } else {
            for (size_t ti = 0; ti < o->bo_ntransports; ti++) {
                const char *t = o->bo_transports[ti];
                bp_add_combo(o, t, t, t, "xth", true);
            }
        }
    }
}

// Across hosts: the launcher's rank, --listen or --connect, one
// combination (tcp+basic unless --transport and --channel name one each).
// Returns -1 to continue, else the exit status.
static int
bp_remote_opts(bp_opts *o, const char *transports, const char *channels)
{
    const char *rank = getenv("RANK"), *world = getenv("WORLD_SIZE");
    if (!o->bo_listen && o->bo_connect == NULL && rank != NULL &&
        world != NULL) {
        o->bo_launched = true;
    }
    int modes = o->bo_listen + (o->bo_connect != NULL) + o->bo_launched;
    if (modes > 0 && o->bo_msgrate) {
        tool_err("bench pipe: --test msgrate runs its pairs on this host "
                 "(not with --listen, --connect or a launched job)");
        return TOOL_EXIT_USAGE;
    }
    if (modes == 0) {
        if (o->bo_bind != NULL) {
            tool_err("bench pipe: --bind needs --listen or a launched job");
            return TOOL_EXIT_USAGE;
        }
        bp_make_combos(o);
        return -1;
    }
    if (modes > 1) {
        tool_err("bench pipe: --listen, --connect and --launched exclude "
                 "each other");
        return TOOL_EXIT_USAGE;
    }
    if (o->bo_launched) {
        char *end = NULL;
        long r = rank ? strtol(rank, &end, 10) : -1;
        if (rank == NULL || world == NULL || *rank == '\0' || *end != '\0' ||
            r < 0 || r > 1 || strcmp(world, "2") != 0) {
            tool_err("bench pipe: a launched run needs RANK 0 or 1 and "
                     "WORLD_SIZE=2 (RANK=%s WORLD_SIZE=%s)",
                     rank ? rank : "(unset)", world ? world : "(unset)");
            return TOOL_EXIT_USAGE;
        }
        o->bo_rank = (int)r;
    }
    if (o->bo_com.bo_reps != 1 || o->bo_plot != NULL) {
        tool_err("bench pipe: --reps and --plot are for local runs (the "
                 "server serves one client)");
        return TOOL_EXIT_USAGE;
    }
    const char *t = o->bo_all_transports ? "tcp" : o->bo_transports[0];
    const char *c = o->bo_all_channels ? "basic" : o->bo_channels[0];
    if ((!o->bo_all_transports && o->bo_ntransports != 1) ||
        (!o->bo_all_channels && o->bo_nchannels != 1) ||
        strcmp(c, "xth") == 0) {
        tool_err("bench pipe: across hosts, name one --transport and one "
                 "--channel (not xth); default tcp and basic (given: %s, %s)",
                 transports, channels);
        return TOOL_EXIT_USAGE;
    }
    char allow[64];
    snprintf(allow, sizeof(allow), "%s%s", t,
             strcmp(c, "mpt") == 0 && strcmp(t, "tcp") != 0 ? ",tcp" : "");
    bp_add_combo(o, allow, t, t, c, false);
    o->bo_combos[0].bc_remote = true;
    return -1;
}

// Returns -1 to continue, else the exit status.
static int
bp_parse_args(int argc, char **argv, bp_opts *o)
{
    const char *transports = "all", *channels = "all";
    memset(o, 0, sizeof(*o));
    bench_opts_init(&o->bo_com, "bench pipe", "bench pipe");
    uint64_t npayloads = 0, lanes = 0;
    o->bo_payload_size = 64;
    uint64_t pairs = 2;
    bench_opt opts[BENCH_OPTS_N + 11] = {
        {"--transport", NULL, BENCH_OPT_STR, &transports, 0, 0, "NAME|all",
         "transports (comma list; default all: every viable\none, best "
         "first, as tpipe info lists them)"},
        {"--channel", NULL, BENCH_OPT_STR, &channels, 0, 0, "NAME|all",
         "channels (comma list; default all, likewise: every\npair but mpt "
         "over shm, and xth once)"},
        {"--payloads", NULL, BENCH_OPT_U64, &npayloads, 0, BP_MAX_PAYLOADS, "N",
         "payloads per message (default 0, max 64)"},
        {"--payload-size", NULL, BENCH_OPT_SIZE, &o->bo_payload_size, 1,
         BP_MAX_PAYLOAD, "S",
         "bytes per payload, K/M = KiB/MiB\n(default 64, max 64M)"},
        {"--lanes", NULL, BENCH_OPT_U64, &lanes, 1, 64, "N",
         "lanes of the mpt channel (default: the library's)"},
        {"--plot", NULL, BENCH_OPT_STR, &o->bo_plot, 0, 0, "FILE.svg",
         "also write stream GB/s against size, with the\nmemcpy and "
         "loopback TCP ceilings"},
        {"--listen", NULL, BENCH_OPT_FLAG, &o->bo_listen, 0, 0, NULL,
         "serve one client of another host: print the URL\nto give its "
         "--connect, serve it, exit"},
        {"--connect", NULL, BENCH_OPT_STR, &o->bo_connect, 0, 0, "URL",
         "measure against a --listen server (same --sizes,\n--window, "
         "--payloads, --transport, --channel)"},
        {"--bind", NULL, BENCH_OPT_STR, &o->bo_bind, 0, 0, "HOST",
         "the server's tcp address (--listen, launched;\n"
         "default: the library's, a routable address)"},
        {"--launched", NULL, BENCH_OPT_FLAG, &o->bo_launched, 0, 0, NULL,
         "run as rank 0 or 1 of a launched job (automatic\n"
         "with RANK and WORLD_SIZE set): rank 0 measures,\nrank 1 serves; "
         "they meet through env://"},
        {"--pairs", NULL, BENCH_OPT_U64, &pairs, 1, BP_MAX_PAIRS, "N",
         "msgrate: pairs of processes streaming at once\n(default 2, max "
         "64)"},
    };
    size_t n = 11 + bench_opts_table(&o->bo_com, opts + 11);
    for (size_t i = 0; i < n; i++) {
        if (strcmp(opts[i].opt_name, "--test") == 0) {
            opts[i].opt_arg = "pingpong|stream|bibw|msgrate|all";
            opts[i].opt_help = "(default all: pingpong and stream)\nbibw: "
                               "stream both ways at once; msgrate:\n"
                               "--pairs pairs stream at once (sizes default"
                               "\n" BP_MSGRATE_SIZES ")";
        }
    }
    bench_opt_set_help(
        opts, n, "--sizes",
        "tensor sizes, K/M/G = KiB/MiB/GiB (default\n" BENCH_DEFAULT_SIZES
        "; at least 16)");
    bench_opt_set_help(opts, n, "--reps",
                       "repeat each measurement R times on new processes\nand "
                       "pipes; report the median of the medians");
    int rc = bench_parse_args("bench pipe", opts, n, &bp_usage, argc, argv);
    if (rc >= 0) {
        return rc;
    }
    o->bo_npayloads = (uint32_t)npayloads;
    o->bo_lanes = (int)lanes;
    o->bo_pairs = (unsigned)pairs;
    if (strcmp(o->bo_com.bo_test_arg, "msgrate") == 0) {
        // OSU's osu_mbw_mr: message rate of small messages, pairs at once.
        o->bo_msgrate = true;
        o->bo_com.bo_test_arg = "stream";
        if (strcmp(o->bo_com.bo_sizes_arg, BENCH_DEFAULT_SIZES) == 0) {
            o->bo_com.bo_sizes_arg = BP_MSGRATE_SIZES;
        }
    }
    if (strcmp(o->bo_com.bo_test_arg, "bibw") == 0) {
        // OSU's osu_bibw: both sides stream at once.
        o->bo_bibw = true;
        o->bo_com.bo_test_arg = "stream";
    }
    if (!bench_opts_test(&o->bo_com)) {
        return TOOL_EXIT_USAGE;
    }
    if (o->bo_plot != NULL && (o->bo_bibw || o->bo_msgrate)) {
        tool_err("bench pipe: --plot draws the stream test (not bibw or "
                 "msgrate)");
        return TOOL_EXIT_USAGE;
    }
    if (o->bo_plot != NULL && !o->bo_com.bo_stream) {
        tool_err("bench pipe: --plot draws the stream test: use --test "
                 "stream or all");
        return TOOL_EXIT_USAGE;
    }
    // Across hosts the default is tcp+basic, without the skip messages of
    // "all".
    if (o->bo_listen || o->bo_connect != NULL || o->bo_launched ||
        (getenv("RANK") != NULL && getenv("WORLD_SIZE") != NULL)) {
        transports = strcmp(transports, "all") == 0 ? "tcp" : transports;
        channels = strcmp(channels, "all") == 0 ? "basic" : channels;
    }
    static char tbuf[256], cbuf[256];
    if (!bench_opts_finish(&o->bo_com) ||
        !bp_parse_names("transport", TOOL_TRANSPORT, transports, tbuf,
                        sizeof(tbuf), o->bo_transports, &o->bo_ntransports,
                        &o->bo_all_transports) ||
        !bp_parse_names("channel", TOOL_CHANNEL, channels, cbuf, sizeof(cbuf),
                        o->bo_channels, &o->bo_nchannels,
                        &o->bo_all_channels)) {
        return TOOL_EXIT_USAGE;
    }
    if (o->bo_npayloads == 0) {
        o->bo_payload_size = 0;
    }
    return bp_remote_opts(o, transports, channels);
}

// ---- across hosts ----------------------------------------------------------

#define BP_STORE_KEY "tpipe/bench_pipe/url"

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
    if (tp_store_open(im && *im ? im : "env://", o->bo_rank, 2, bp_wait_ms(o),
                      &st, &err) != TP_OK) {
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
        if (tp_store_set(st, BP_STORE_KEY, url, strlen(url), bp_wait_ms(o),
                         &err) != TP_OK) {
            tool_err("bench pipe: rank 1: publishing %s: %s", url,
                     tp_error_message(err));
            tp_error_unref(err);
            goto done;
        }
        tool_verbose(o->bo_com.bo_verbose, "bench pipe",
                     "rank 1: serving %s on %s", c->bc_label, url);
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
    if (tp_store_get(*st_p, BP_STORE_KEY, bp_wait_ms(o), &val, &n, &err) !=
        TP_OK) {
        tool_err("bench pipe: rank 0: waiting for rank 1's URL: %s",
                 tp_error_message(err));
        tp_error_unref(err);
        return false;
    }
    snprintf(url, len, "%.*s", (int)n, (const char *)val);
    tp_free(val);
    tool_verbose(o->bo_com.bo_verbose, "bench pipe", "rank 0: server at %s",
                 url);
    return true;
}

// ---- msgrate: pairs at once -------------------------------------------------

// What a pair's child reports through its pipe(2).
typedef struct bp_pair_rec {
    int pp_outcome; // bp_outcome
    char pp_transport[32];
    char pp_err[512];
    double pp_gbps[BENCH_MAX_SIZES]; // median over its repetitions
    uint64_t pp_iters[BENCH_MAX_SIZES];
} bp_pair_rec;

// A pair's child: its own server (forked by bp_run_rep) and client; the
// stream cells' medians go to @wfd. Never returns.
static void
bp_pair_child(bp_run *r, int wfd)
{
    const bench_opts *c = &r->pr_opts->bo_com;
    static bp_pair_rec rec;
    size_t ncells = 2 * c->bo_nsizes;
    bench_cell *cells = calloc(ncells, sizeof(*cells));
    double *vals = calloc(ncells * 4 * c->bo_reps, sizeof(double));
    if (cells == NULL || vals == NULL) {
        _exit(1);
    }
    bench_cells_reset(c, cells, vals);
    // This child's copy of the options (main's, not const): the pair
    // prints no rows, the sums are the rows.
    ((bench_opts *)c)->bo_done_fn = NULL;
    bp_outcome out = BP_OK;
    for (unsigned rep = 0; rep < c->bo_reps && out == BP_OK; rep++) {
        out = bp_run_rep(r, cells);
    }
    rec.pp_outcome = (int)out;
    snprintf(rec.pp_transport, sizeof(rec.pp_transport), "%s", r->pr_transport);
    snprintf(rec.pp_err, sizeof(rec.pp_err), "%.500s", r->pr_err);
    for (size_t i = 0; i < c->bo_nsizes; i++) {
        bench_medians m;
        bench_cell *cell = &cells[c->bo_nsizes + i];
        rec.pp_gbps[i] = bench_cell_medians(cell, &m) ? m.bm_gbps : NAN;
        rec.pp_iters[i] = cell->bc_iters;
    }
    bool ok = write(wfd, &rec, sizeof(rec)) == (ssize_t)sizeof(rec);
    _exit(ok ? 0 : 1);
}

// Reads one record from @fd by @deadline (CLOCK_MONOTONIC ns).
static bool
bp_pair_read(int fd, uint64_t deadline, bp_pair_rec *rec)
{
    size_t got = 0;
    while (got < sizeof(*rec)) {
        uint64_t now = tp__now_ns();
        if (now >= deadline) {
            return false;
        }
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int prc = poll(&pfd, 1, (int)((deadline - now) / 1000000 + 1));
        if (prc < 0 && errno == EINTR) {
            continue;
        }
        if (prc <= 0) {
            return false;
        }
        ssize_t n = read(fd, (char *)rec + got, sizeof(*rec) - got);
        if (n <= 0) {
            if (n < 0 && errno == EINTR) {
                continue;
            }
            return false;
        }
        got += (size_t)n;
    }
    return true;
}

// --test msgrate: o->bo_pairs children, each a pair (its own server and
// client, as a local stream), started at once; the stream cells get the
// sums of the pairs' GB/s (one repetition). BP_SKIP or BP_FAIL with
// r->pr_err set.
static bp_outcome
bp_msgrate(bp_run *r, bench_cell *cells)
{
    const bp_opts *o = r->pr_opts;
    const bench_opts *c = &o->bo_com;
    pid_t pids[BP_MAX_PAIRS];
    int fds[BP_MAX_PAIRS];
    unsigned n = 0;
    bp_outcome out = BP_OK;
    fflush(stdout);
    fflush(stderr);
    for (; n < o->bo_pairs; n++) {
        int pfd[2];
        if (pipe(pfd) != 0) {
            snprintf(r->pr_err, sizeof(r->pr_err), "pipe: %s", strerror(errno));
            out = BP_FAIL;
            break;
        }
        pid_t pid = fork();
        if (pid == 0) {
            close(pfd[0]);
            for (unsigned i = 0; i < n; i++) {
                close(fds[i]);
            }
            bp_pair_child(r, pfd[1]);
        }
        close(pfd[1]);
        if (pid < 0) {
            close(pfd[0]);
            snprintf(r->pr_err, sizeof(r->pr_err), "fork: %s", strerror(errno));
            out = BP_FAIL;
            break;
        }
        pids[n] = pid;
        fds[n] = pfd[0];
    }
    // Each pair: its setup, per size a warm-up and the budget, plus the
    // stall timeout.
    double secs =
        (double)c->bo_reps * (double)c->bo_nsizes * (3.0 * c->bo_budget + 5.0) +
        2.0 * c->bo_stall_s + 10.0;
    uint64_t deadline = tp__now_ns() + (uint64_t)(secs * 1e9);
    double sum[BENCH_MAX_SIZES] = {0};
    uint64_t iters[BENCH_MAX_SIZES] = {0};
    for (unsigned i = 0; i < n; i++) {
        static bp_pair_rec rec;
        if (out == BP_OK && !bp_pair_read(fds[i], deadline, &rec)) {
            snprintf(r->pr_err, sizeof(r->pr_err),
                     "pair %u: no result within %.0f s", i, secs);
            out = BP_FAIL;
        } else if (out == BP_OK && rec.pp_outcome != BP_OK) {
            snprintf(r->pr_err, sizeof(r->pr_err), "pair %u: %s", i,
                     rec.pp_err);
            out = (bp_outcome)rec.pp_outcome;
        } else if (out == BP_OK) {
            snprintf(r->pr_transport, sizeof(r->pr_transport), "%s",
                     rec.pp_transport);
            for (size_t k = 0; k < c->bo_nsizes; k++) {
                sum[k] += rec.pp_gbps[k];
                iters[k] += rec.pp_iters[k];
            }
        }
        close(fds[i]);
    }
    for (unsigned i = 0; i < n; i++) {
        if (out != BP_OK) {
            kill(pids[i], SIGKILL);
        }
        int st = 0;
        while (waitpid(pids[i], &st, 0) < 0 && errno == EINTR) {
        }
    }
    for (size_t k = 0; out == BP_OK && k < c->bo_nsizes; k++) {
        bench_cell *cell = &cells[c->bo_nsizes + k];
        cell->bc_p50[0] = cell->bc_p90[0] = cell->bc_p99[0] = NAN;
        cell->bc_gbps[0] = sum[k];
        cell->bc_iters = iters[k];
        cell->bc_n = 1;
        if (c->bo_done_fn != NULL) {
            c->bo_done_fn(c->bo_done_arg, cell);
        }
    }
    return out;
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
    double g = bp_print_cell(d->pd_out, d->pd_opts, d->pd_run->pr_combo,
                             d->pd_run->pr_transport, cell);
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
    if (o.bo_listen || (o.bo_launched && o.bo_rank == 1)) {
        return bp_serve(&o);
    }
    static char remote_url[1024];
    tp_store *store = NULL;
    bool remote = o.bo_connect != NULL || o.bo_launched;
    if (remote && !bp_client_url(&o, &store, remote_url, sizeof(remote_url))) {
        tp_store_close(store);
        return TOOL_EXIT_FAIL;
    }

    size_t ncells = 2 * o.bo_com.bo_nsizes;
    bench_cell *cells = calloc(ncells, sizeof(*cells));
    double *vals = calloc(ncells * 4 * o.bo_com.bo_reps, sizeof(double));
    bp_result *res = calloc(o.bo_ncombos, sizeof(*res));
    double *gbps =
        calloc(2 * o.bo_ncombos * o.bo_com.bo_nsizes, sizeof(double));
    if (cells == NULL || vals == NULL || res == NULL || gbps == NULL) {
        tool_err("out of memory");
        free(cells);
        free(vals);
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
        if (o.bo_msgrate) {
            out = bp_msgrate(&r, cells);
        }
        for (unsigned rep = 0;
             rep < o.bo_com.bo_reps && out == BP_OK && !o.bo_msgrate; rep++) {
            tool_verbose(o.bo_com.bo_verbose, "bench pipe",
                         "%s: repetition %u of %u", cb->bc_label, rep + 1,
                         o.bo_com.bo_reps);
            out = remote ? bp_run_remote(&r, remote_url, cells)
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
    free(cells);
    free(vals);
    free(res);
    free(gbps);
    return failed ? TOOL_EXIT_FAIL : TOOL_EXIT_OK;
}
