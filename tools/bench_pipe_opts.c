// SPDX-License-Identifier: Apache-2.0
// bench_pipe_opts.c - `tpipe bench pipe`: its options (the usage, the
// transport and channel lists, the combinations to measure, the modes
// across hosts), checked into a bp_opts (bench_pipe.h).

#include <stdlib.h>
#include <string.h>

#include <tpipe/info.h>

#include "bench_pipe.h"
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
    if ((o->bo_listen || o->bo_connect != NULL) && o->bo_msgrate) {
        tool_err("bench pipe: --test msgrate needs its pairs on this host or "
                 "as the ranks of a launched job (not --listen or "
                 "--connect)");
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
        char *end = NULL, *wend = NULL;
        long r = rank ? strtol(rank, &end, 10) : -1;
        long w = world ? strtol(world, &wend, 10) : -1;
        bool wbad = world == NULL || *world == '\0' || *wend != '\0';
        bool rbad = rank == NULL || *rank == '\0' || *end != '\0' || r < 0;
        if (o->bo_msgrate && (rbad || wbad || w < 2 || w > 2 * BP_MAX_PAIRS ||
                              w % 2 != 0 || r >= w)) {
            // OSU's osu_mbw_mr: ranks 0..P-1 stream to P..2P-1.
            tool_err("bench pipe: a launched msgrate run needs an even "
                     "WORLD_SIZE of 2..%d (ranks 0..P-1 send to P..2P-1) and "
                     "a RANK below it (RANK=%s WORLD_SIZE=%s)",
                     2 * BP_MAX_PAIRS, rank ? rank : "(unset)",
                     world ? world : "(unset)");
            return TOOL_EXIT_USAGE;
        }
        if (!o->bo_msgrate && (rbad || wbad || r > 1 || w != 2)) {
            tool_err("bench pipe: a launched run needs RANK 0 or 1 and "
                     "WORLD_SIZE=2 (RANK=%s WORLD_SIZE=%s)",
                     rank ? rank : "(unset)", world ? world : "(unset)");
            return TOOL_EXIT_USAGE;
        }
        o->bo_rank = (int)r;
        o->bo_world = (int)w;
        if (o->bo_msgrate) {
            o->bo_pairs = (unsigned)(w / 2); // the job's pairs
        }
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
int
bp_parse_args(int argc, char **argv, bp_opts *o)
{
    const char *transports = "all", *channels = "all";
    memset(o, 0, sizeof(*o));
    bench_opts_init(&o->bo_com, "bench pipe", "bench pipe");
    uint64_t npayloads = 0, lanes = 0;
    o->bo_payload_size = 64;
    uint64_t pairs = 2;
    enum { BP_OWN_OPTS = 13 }; // the entries below
    bench_opt opts[BENCH_OPTS_N + BP_OWN_OPTS] = {
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
         "64; launched: WORLD_SIZE / 2)"},
        {"--device-channel", NULL, BENCH_OPT_STR, &o->bo_device_channel, 0, 0,
         "NAME|none",
         "with --device cuda: the device channel the\npipe may use beside "
         "--channel (default:\nany built, e.g. cuda_ipc); none = staged\n"
         "through host memory"},
        {"--device", NULL, BENCH_OPT_STR, &o->bo_device, 0, 0, "SPEC",
         "where the tensors are: cpu (default), cuda:N, or\nSRC->DST / "
         "SRC,DST (sender's, receiver's), e.g.\ncuda:0,cpu; adds cudaMemcpy "
         "baseline rows;\nexit 77 where CUDA is not usable"},
    };
    size_t n = BP_OWN_OPTS + bench_opts_table(&o->bo_com, opts + BP_OWN_OPTS);
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
    // Before the transport lists (whose skip lines would come first): a
    // run that cannot measure here says only why.
    if ((rc = bp_dev_check(o)) >= 0) {
        return rc;
    }
    static char tbuf[256], cbuf[256];
    if (!bench_opts_finish(&o->bo_com) ||
        !bp_parse_names("transport", TOOL_TRANSPORT, transports, tbuf,
                        sizeof(tbuf), o->bo_transports, &o->bo_ntransports,
                        &o->bo_all_transports) ||
        !bp_parse_names("channel", TOOL_PIPE_CHANNEL, channels, cbuf,
                        sizeof(cbuf), o->bo_channels, &o->bo_nchannels,
                        &o->bo_all_channels)) {
        return TOOL_EXIT_USAGE;
    }
    if (o->bo_npayloads == 0) {
        o->bo_payload_size = 0;
    }
    rc = bp_remote_opts(o, transports, channels);
    return rc >= 0 ? rc : bp_dev_check_indices(o);
}
