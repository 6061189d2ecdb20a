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
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <tpipe/pipe.h>

#include "bench_common.h"
#include "bench_peer.h"
#include "core/platform.h"
#include "tool.h"

#define BP_MAX_NAMES    8
#define BP_MAX_COMBOS   32
#define BP_MAX_PAYLOADS 64u
#define BP_MAX_PAYLOAD  (64u << 20)

// One transport/channel combination.
typedef struct bp_combo {
    char bc_transports[32]; // allow list of both contexts: "tcp", "tcp,shm"
    char bc_connect[8];     // transport whose listener URL the client dials
    char bc_expect[8];      // the transport the pipe must choose ("" = any)
    char bc_channel[16];
    bool bc_inproc; // both contexts in this process (xth)
    char bc_label[48];
} bp_combo;

typedef struct bp_opts {
    bench_opts bo_com; // the options bench transport has too
    const char *bo_transports[BP_MAX_NAMES];
    size_t bo_ntransports;
    bool bo_all_transports;
    const char *bo_channels[BP_MAX_NAMES];
    size_t bo_nchannels;
    bool bo_all_channels;
    bp_combo bo_combos[BP_MAX_COMBOS];
    size_t bo_ncombos;
    uint32_t bo_npayloads;
    uint64_t bo_payload_size;
    int bo_lanes;
    const char *bo_plot;
} bp_opts;

// What a combination produced, for the output and the plot.
typedef struct bp_result {
    const bp_combo *pr_combo;
    char pr_transport[32]; // the one negotiated
    bool pr_ok;
    double *pr_stream_gbps; // [nsizes], NAN where not measured
} bp_result;

typedef enum bp_outcome { BP_OK, BP_SKIP, BP_FAIL } bp_outcome;

static void
bp_usage(FILE *f)
{
    fprintf(
        f,
        "usage: tpipe bench pipe [options]\n"
        "\n"
        "Pipe messages of one tensor of SIZE bytes (plus --payloads) "
        "between two\n"
        "contexts: a forked server process and this one (xth: two contexts "
        "in this\n"
        "process). pingpong: this side writes a message, the server reads "
        "it into a\n"
        "preallocated buffer and writes it back; round trip p50/p90/p99 in "
        "us.\n"
        "stream: W writes in flight; GB/s = bytes / time until the server's "
        "ack\n"
        "(1 GB = 1e9 B).\n"
        "\n"
        "  --transport tcp|shm|all   transports (comma list; default all)\n"
        "  --channel basic|cma|mpt|xth|all  channels (comma list; default "
        "all:\n"
        "                            tcp+basic tcp+mpt tcp+cma shm+basic "
        "shm+cma xth)\n"
        "  --sizes LIST              tensor sizes, K/M/G = KiB/MiB/GiB "
        "(default\n"
        "                            %s; at least %u)\n"
        "  --test pingpong|stream|all  (default all)\n"
        "  --payloads N              payloads per message (default 0, max "
        "%u)\n"
        "  --payload-size S          bytes per payload (default 64)\n"
        "  --iters N                 at most N measured iterations (stream: "
        "messages)\n"
        "                            per measurement (default 1000000; at "
        "least 10)\n"
        "  --budget SECONDS          time per measurement (default 0.5)\n"
        "  --window W                stream writes in flight (default 4, max "
        "%u)\n"
        "  --reps R                  repeat each measurement R times on new "
        "processes\n"
        "                            and pipes; report the median of the "
        "medians\n"
        "  --lanes N                 lanes of the mpt channel (default: the "
        "library's)\n"
        "  --json                    one JSON object per line instead of a "
        "table\n"
        "  --plot FILE.svg           also write stream GB/s against size, "
        "with the\n"
        "                            memcpy and loopback TCP ceilings\n"
        "  --stall-timeout SECONDS   abort a measurement that makes no "
        "progress for\n"
        "                            this long (default 30)\n"
        "  -v, --verbose             progress on stderr\n"
        "\n"
        "JSON line: {\"bench\":\"pipe\",\"transport\":\"tcp\",\"channel\":"
        "\"basic\",\"mode\":\"proc\",\n"
        "  \"test\":\"pingpong\",\"size\":64,\"payloads\":0,"
        "\"payload_size\":0,\"p50_us\":..,\"p90_us\":..,\n"
        "  \"p99_us\":..,\"gbps\":null,\"iters\":..,\"reps\":1}\n"
        "(latency fields null for stream, gbps null for pingpong).\n",
        BENCH_DEFAULT_SIZES, BT_MIN_SIZE, BP_MAX_PAYLOADS, BT_MAX_WINDOW);
}

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

static bool
bp_parse_transports(const char *list, bp_opts *o)
{
    static char buf[256];
    if (strcmp(list, "all") == 0) {
        list = "tcp,shm";
        o->bo_all_transports = true;
    }
    snprintf(buf, sizeof(buf), "%s", list);
    if (!bp_split("transport", buf, o->bo_transports, &o->bo_ntransports)) {
        return false;
    }
    for (size_t i = 0; i < o->bo_ntransports; i++) {
        if (!tool_backend_known(TOOL_TRANSPORT, o->bo_transports[i])) {
            tool_backend_unknown("bench pipe", TOOL_TRANSPORT,
                                 o->bo_transports[i], "all");
            return false;
        }
    }
    return true;
}

static bool
bp_parse_channels(const char *list, bp_opts *o)
{
    static char buf[256];
    if (strcmp(list, "all") == 0) {
        list = "basic,mpt,cma,xth";
        o->bo_all_channels = true;
    }
    snprintf(buf, sizeof(buf), "%s", list);
    if (!bp_split("channel", buf, o->bo_channels, &o->bo_nchannels)) {
        return false;
    }
    size_t kept = 0;
    for (size_t i = 0; i < o->bo_nchannels; i++) {
        if (tool_backend_known(TOOL_CHANNEL, o->bo_channels[i])) {
            o->bo_channels[kept++] = o->bo_channels[i];
            continue;
        }
        if (o->bo_all_channels) {
            fprintf(stderr,
                    "tpipe: bench pipe: skipping channel %s: not built in\n",
                    o->bo_channels[i]);
            continue;
        }
        tool_backend_unknown("bench pipe", TOOL_CHANNEL, o->bo_channels[i],
                             "all");
        return false;
    }
    o->bo_nchannels = kept;
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
// With every transport and channel (the default), shm+mpt is left out (the
// pipe runs mpt over tcp only; ask for it with --transport shm --channel
// mpt to see its refusal), and xth is one combination that lets the two
// contexts negotiate tcp or shm.
static void
bp_make_combos(bp_opts *o)
{
    bool all = o->bo_all_transports && o->bo_all_channels;
    for (size_t ti = 0; ti < o->bo_ntransports; ti++) {
        for (size_t ci = 0; ci < o->bo_nchannels; ci++) {
            const char *t = o->bo_transports[ti], *c = o->bo_channels[ci];
            if (strcmp(c, "xth") == 0 ||
                (all && strcmp(t, "shm") == 0 && strcmp(c, "mpt") == 0)) {
                continue;
            }
            char allow[32];
            snprintf(allow, sizeof(allow), "%s%s", t,
                     strcmp(c, "mpt") == 0 && strcmp(t, "tcp") != 0 ? ",tcp"
                                                                    : "");
            bp_add_combo(o, allow, t, t, c, false);
        }
    }
    for (size_t ci = 0; ci < o->bo_nchannels; ci++) {
        if (strcmp(o->bo_channels[ci], "xth") != 0) {
            continue;
        }
        if (o->bo_all_transports) {
            // Dial tcp so that the handshake may upgrade to shm.
            bp_add_combo(o, "tcp,shm", "tcp", "", "xth", true);
        } else {
            for (size_t ti = 0; ti < o->bo_ntransports; ti++) {
                const char *t = o->bo_transports[ti];
                bp_add_combo(o, t, t, t, "xth", true);
            }
        }
    }
}

// Returns -1 to continue, else the exit status.
static int
bp_parse_args(int argc, char **argv, bp_opts *o)
{
    const char *transports = "all", *channels = "all";
    memset(o, 0, sizeof(*o));
    bench_opts_init(&o->bo_com, "bench pipe", "bench pipe");
    o->bo_payload_size = 64;
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        bool bad = false;
        const char *a = argv[i];
        uint64_t u = 0;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            bp_usage(stdout);
            return TOOL_EXIT_OK;
        } else if (bench_opts_arg(&o->bo_com, argc, argv, &i, &bad)) {
            // A common option.
        } else if (tool_opt_value(argc, argv, &i, "--transport", &v, &bad)) {
            transports = v;
        } else if (tool_opt_value(argc, argv, &i, "--channel", &v, &bad)) {
            channels = v;
        } else if (tool_opt_value(argc, argv, &i, "--plot", &v, &bad)) {
            o->bo_plot = v;
        } else if (tool_opt_value(argc, argv, &i, "--payloads", &v, &bad)) {
            if (!bad && (!tool_parse_u64(v, &u) || u > BP_MAX_PAYLOADS)) {
                tool_err("bench pipe: --payloads must be 0..%u",
                         BP_MAX_PAYLOADS);
                bad = true;
            }
            o->bo_npayloads = (uint32_t)u;
        } else if (tool_opt_value(argc, argv, &i, "--payload-size", &v, &bad)) {
            if (!bad && (!tool_parse_size(v, &o->bo_payload_size) ||
                         o->bo_payload_size < 1 ||
                         o->bo_payload_size > BP_MAX_PAYLOAD)) {
                tool_err("bench pipe: --payload-size must be 1..64M");
                bad = true;
            }
        } else if (tool_opt_value(argc, argv, &i, "--lanes", &v, &bad)) {
            if (!bad && (!tool_parse_u64(v, &u) || u < 1 || u > 64)) {
                tool_err("bench pipe: --lanes must be 1..64");
                bad = true;
            }
            o->bo_lanes = (int)u;
        } else {
            tool_err("bench pipe: unknown option \"%s\"", a);
            bad = true;
        }
        if (bad) {
            bp_usage(stderr);
            return TOOL_EXIT_USAGE;
        }
    }
    if (!bench_opts_test(&o->bo_com)) {
        return TOOL_EXIT_USAGE;
    }
    if (o->bo_plot != NULL && !o->bo_com.bo_stream) {
        tool_err("bench pipe: --plot draws the stream test: use --test "
                 "stream or all");
        return TOOL_EXIT_USAGE;
    }
    if (!bench_opts_finish(&o->bo_com) || !bp_parse_transports(transports, o) ||
        !bp_parse_channels(channels, o)) {
        return TOOL_EXIT_USAGE;
    }
    if (o->bo_npayloads == 0) {
        o->bo_payload_size = 0;
    }
    bp_make_combos(o);
    return -1;
}

// ---- server: echo and sink -------------------------------------------------

typedef struct bp_server bp_server;

// One message the server is reading or answering: its own buffers, a
// read and a write aio. A slot is busy from its descriptor until its read
// (sink) or its answer's write (echo, ack) completed.
typedef struct bp_slot {
    bp_server *ss_srv;
    tp_aio *ss_rd;
    tp_aio *ss_wr;
    tp_message *ss_msg; // from tp_pipe_read_descriptor
    tp_message ss_out;  // echo or ack
    tp_msg_buf ss_out_t;
    tp_msg_buf *ss_out_p; // bo_npayloads
    uint8_t *ss_buf;      // tensor
    uint8_t *ss_pay;      // payloads, bo_payload_size each
    char ss_op;
    bool ss_busy;
} bp_slot;

struct bp_server {
    bt_sync sv_sync;
    const bp_opts *sv_opts;
    tp_pipe_listener *sv_listener;
    tp_pipe *sv_pipe;
    tp_aio *sv_accept;
    tp_aio *sv_desc;
    unsigned sv_nslots;
    bp_slot *sv_slots;
    // loop thread
    unsigned sv_head; // next slot to use
    bool sv_desc_posted;
    bool sv_quitting;
};

static const char bp_md_echo = 'R';
static const char bp_md_ack = 'K';

static void
bp_bump(bt_sync *s)
{
    atomic_fetch_add_explicit(&s->bs_progress, 1, memory_order_relaxed);
}

static void bp_srv_accept_cb(void *arg);
static void bp_srv_desc_cb(void *arg);
static void bp_srv_rd_cb(void *arg);
static void bp_srv_wr_cb(void *arg);

static void
bp_server_fini(bp_server *s)
{
    tp_aio_destroy(s->sv_accept);
    tp_aio_destroy(s->sv_desc);
    for (unsigned i = 0; s->sv_slots != NULL && i < s->sv_nslots; i++) {
        bp_slot *sl = &s->sv_slots[i];
        tp_aio_destroy(sl->ss_rd);
        tp_aio_destroy(sl->ss_wr);
        tp_message_destroy(sl->ss_msg);
        free(sl->ss_out_p);
        free(sl->ss_buf);
        free(sl->ss_pay);
    }
    free(s->sv_slots);
    tp_pipe_unref(s->sv_pipe);
    bt_sync_fini(&s->sv_sync);
    memset(s, 0, sizeof(*s));
}

// W+1 slots of the largest size. Returns false on out of memory.
static bool
bp_server_init(bp_server *s, const bp_opts *o, tp_pipe_listener *l)
{
    memset(s, 0, sizeof(*s));
    bt_sync_init(&s->sv_sync);
    s->sv_opts = o;
    s->sv_listener = l;
    s->sv_nslots = o->bo_com.bo_window + 1;
    s->sv_slots = calloc(s->sv_nslots, sizeof(bp_slot));
    int64_t tmo = (int64_t)(o->bo_com.bo_stall_s * 2000);
    if (s->sv_slots == NULL ||
        tp_aio_create(bp_srv_accept_cb, s, &s->sv_accept) != TP_OK ||
        tp_aio_create(bp_srv_desc_cb, s, &s->sv_desc) != TP_OK) {
        return false;
    }
    tp_aio_set_timeout(s->sv_accept, tmo);
    for (unsigned i = 0; i < s->sv_nslots; i++) {
        bp_slot *sl = &s->sv_slots[i];
        sl->ss_srv = s;
        if (tp_aio_create(bp_srv_rd_cb, sl, &sl->ss_rd) != TP_OK ||
            tp_aio_create(bp_srv_wr_cb, sl, &sl->ss_wr) != TP_OK) {
            return false;
        }
        tp_aio_set_timeout(sl->ss_rd, tmo);
        tp_aio_set_timeout(sl->ss_wr, tmo);
        sl->ss_buf = bt_buf_alloc(o->bo_com.bo_max_size);
        if (sl->ss_buf == NULL) {
            return false;
        }
        if (o->bo_npayloads > 0) {
            sl->ss_out_p = calloc(o->bo_npayloads, sizeof(tp_msg_buf));
            sl->ss_pay = bt_buf_alloc(o->bo_npayloads * o->bo_payload_size);
            if (sl->ss_out_p == NULL || sl->ss_pay == NULL) {
                return false;
            }
        }
    }
    return true;
}

static void
bp_srv_fail(bp_server *s, const char *what, const tp_aio *aio)
{
    bt_sync_fail(&s->sv_sync, "server %s: %s", what,
                 tp_error_message(tp_aio_error(aio)));
}

// Loop thread: read the next descriptor if a slot is free for it.
static void
bp_srv_post_desc(bp_server *s)
{
    if (s->sv_desc_posted || s->sv_quitting ||
        s->sv_slots[s->sv_head % s->sv_nslots].ss_busy ||
        bt_sync_failed(&s->sv_sync)) {
        return;
    }
    s->sv_desc_posted = true;
    tp_pipe_read_descriptor(s->sv_pipe, s->sv_desc);
}

static void
bp_srv_accept_cb(void *arg)
{
    bp_server *s = arg;
    bp_bump(&s->sv_sync);
    if (tp_aio_error(s->sv_accept) != NULL) {
        bp_srv_fail(s, "accept", s->sv_accept);
        return;
    }
    s->sv_pipe = tp_aio_get_output(s->sv_accept, 0);
    bp_srv_post_desc(s);
}

static void
bp_srv_desc_cb(void *arg)
{
    bp_server *s = arg;
    const bp_opts *o = s->sv_opts;
    bp_bump(&s->sv_sync);
    s->sv_desc_posted = false;
    if (tp_aio_error(s->sv_desc) != NULL) {
        bp_srv_fail(s, "read descriptor", s->sv_desc);
        return;
    }
    tp_message *m = tp_aio_get_output(s->sv_desc, 0);
    char op = m->metadata_len == 1 ? *(const char *)m->metadata : '?';
    bool ok = strchr("PSAQ", op) != NULL && m->ntensors <= 1 &&
              m->npayloads <= o->bo_npayloads;
    for (uint32_t i = 0; ok && i < m->ntensors; i++) {
        ok = m->tensors[i].len <= o->bo_com.bo_max_size;
    }
    for (uint32_t i = 0; ok && i < m->npayloads; i++) {
        ok = m->payloads[i].len <= o->bo_payload_size;
    }
    if (!ok) {
        bt_sync_fail(&s->sv_sync,
                     "server: unexpected message (metadata %llu bytes, %u "
                     "payloads, %u tensors)",
                     (unsigned long long)m->metadata_len, m->npayloads,
                     m->ntensors);
        tp_message_destroy(m);
        return;
    }
    bp_slot *sl = &s->sv_slots[s->sv_head++ % s->sv_nslots];
    sl->ss_busy = true;
    sl->ss_op = op;
    sl->ss_msg = m;
    if (m->ntensors == 1) {
        m->tensors[0].data = sl->ss_buf;
    }
    for (uint32_t i = 0; i < m->npayloads; i++) {
        m->payloads[i].data = sl->ss_pay + i * o->bo_payload_size;
    }
    tp_pipe_read(s->sv_pipe, m, sl->ss_rd);
    if (op == 'Q') {
        s->sv_quitting = true;
    }
    bp_srv_post_desc(s);
}

static void
bp_srv_rd_cb(void *arg)
{
    bp_slot *sl = arg;
    bp_server *s = sl->ss_srv;
    bp_bump(&s->sv_sync);
    if (tp_aio_error(sl->ss_rd) != NULL) {
        bp_srv_fail(s, "read", sl->ss_rd);
        return;
    }
    tp_message *m = sl->ss_msg;
    sl->ss_msg = NULL;
    if (sl->ss_op == 'S') {
        tp_message_destroy(m);
        sl->ss_busy = false;
        bp_srv_post_desc(s);
        return;
    }
    tp_message *out = &sl->ss_out;
    memset(out, 0, sizeof(*out));
    if (sl->ss_op == 'P') {
        // Echo the same bytes from the same (our own) buffers.
        out->metadata = (void *)&bp_md_echo;
        out->metadata_len = 1;
        if (m->ntensors == 1) {
            sl->ss_out_t = (tp_msg_buf){.data = sl->ss_buf,
                                        .len = m->tensors[0].len,
                                        .device = m->tensors[0].device};
            out->tensors = &sl->ss_out_t;
            out->ntensors = 1;
        }
        for (uint32_t i = 0; i < m->npayloads; i++) {
            sl->ss_out_p[i] = (tp_msg_buf){.data = m->payloads[i].data,
                                           .len = m->payloads[i].len,
                                           .device = m->payloads[i].device};
        }
        out->payloads = sl->ss_out_p;
        out->npayloads = m->npayloads;
    } else {
        out->metadata = (void *)&bp_md_ack;
        out->metadata_len = 1;
    }
    tp_message_destroy(m);
    tp_pipe_write(s->sv_pipe, out, sl->ss_wr);
}

static void
bp_srv_wr_cb(void *arg)
{
    bp_slot *sl = arg;
    bp_server *s = sl->ss_srv;
    bp_bump(&s->sv_sync);
    if (tp_aio_error(sl->ss_wr) != NULL) {
        bp_srv_fail(s, sl->ss_op == 'P' ? "echo" : "ack", sl->ss_wr);
        return;
    }
    sl->ss_busy = false;
    if (sl->ss_op == 'Q') {
        bt_sync_done(&s->sv_sync);
        return;
    }
    bp_srv_post_desc(s);
}

// A context for combination @c. Returns false with @why set.
static bool
bp_context(const bp_opts *o, const bp_combo *c, const char *name,
           tp_context **ctx_p, char *why, size_t why_len)
{
    tp_context_options co;
    tp_context_options_init(&co);
    co.name = name;
    co.transports = c->bc_transports;
    co.channels = c->bc_channel;
    co.mpt_lanes = o->bo_lanes;
    tp_error *err = NULL;
    if (tp_context_create(&co, ctx_p, &err) != TP_OK) {
        snprintf(why, why_len, "context: %s", tp_error_message(err));
        tp_error_unref(err);
        *ctx_p = NULL;
        return false;
    }
    return true;
}

// The report as one line ("a; b; c"), for error messages.
static void
bp_flatten(char *s)
{
    size_t n = s ? strlen(s) : 0;
    while (n > 0 && (s[n - 1] == '\n' || s[n - 1] == ' ')) {
        s[--n] = '\0';
    }
    for (char *p = s; p && *p; p++) {
        if (*p == '\n') {
            *p = ';';
        }
    }
}

// Creates the server's context and listener, allocates and starts
// accepting. On success writes the URL to dial into @url. On failure
// returns BP_SKIP (the combination is not available here) or BP_FAIL with
// @why set; whatever was created is left in *ctx_p / s for the caller to
// free.
static bp_outcome
bp_server_setup(const bp_opts *o, const bp_combo *c, tp_context **ctx_p,
                bp_server *s, char *url, size_t url_len, char *why,
                size_t why_len)
{
    if (!bp_context(o, c, "bench-server", ctx_p, why, why_len)) {
        return BP_SKIP;
    }
    const char *tcp_url = "tcp://127.0.0.1:0";
    bool tcp = strstr(c->bc_transports, "tcp") != NULL;
    tp_pipe_listener *l = NULL;
    tp_error *err = NULL;
    // Both processes are on this host: tcp listens on loopback, as the
    // peers it is compared with do.
    if (tp_context_listen(*ctx_p, tcp ? &tcp_url : NULL, tcp ? 1 : 0, &l,
                          &err) != TP_OK) {
        snprintf(why, why_len, "listen: %s", tp_error_message(err));
        tp_error_unref(err);
        return BP_FAIL;
    }
    const char *addr = tp_pipe_listener_addr(l, c->bc_connect);
    if (addr == NULL) {
        char *rep = tp_context_report(*ctx_p);
        bp_flatten(rep);
        snprintf(why, why_len, "the server does not listen on %s (%s)",
                 c->bc_connect, rep ? rep : "no report");
        free(rep);
        tp_pipe_listener_destroy(l);
        return BP_SKIP;
    }
    if ((size_t)snprintf(url, url_len, "%s", addr) >= url_len) {
        snprintf(why, why_len, "listener URL too long");
        tp_pipe_listener_destroy(l);
        return BP_FAIL;
    }
    // Buffers before the client connects: touching them takes a while.
    if (!bp_server_init(s, o, l)) {
        snprintf(why, why_len, "out of memory for %u buffers of %llu bytes",
                 o->bo_com.bo_window + 1,
                 (unsigned long long)o->bo_com.bo_max_size);
        return BP_FAIL;
    }
    tp_pipe_listener_accept(l, s->sv_accept);
    return BP_OK;
}

static void
bp_server_teardown(tp_context *ctx, bp_server *s)
{
    if (s->sv_pipe != NULL) {
        tp_pipe_close(s->sv_pipe);
    }
    if (s->sv_listener != NULL) {
        tp_pipe_listener_destroy(s->sv_listener);
        s->sv_listener = NULL;
    }
    if (s->sv_opts != NULL) {
        bp_server_fini(s);
    }
    tp_context_destroy(ctx);
}

// The forked server: never returns.
static void
bp_server_child(const bp_opts *o, const bp_combo *c, int wfd)
{
    static bp_server srv;
    tp_context *ctx = NULL;
    char url[512], why[1024], msg[1600];
    bp_outcome rc =
        bp_server_setup(o, c, &ctx, &srv, url, sizeof(url), why, sizeof(why));
    int n = rc == BP_OK ? snprintf(msg, sizeof(msg), "OK %s\n", url)
                        : snprintf(msg, sizeof(msg), "%s %s\n",
                                   rc == BP_SKIP ? "SKIP" : "ERR", why);
    n = n < (int)sizeof(msg) ? n : (int)sizeof(msg) - 1;
    if (write(wfd, msg, (size_t)n) != n || rc != BP_OK) {
        _exit(rc == BP_OK ? 1 : 0);
    }
    close(wfd);
    // The client drives; the server only notices a dead client (the pipe
    // fails) or one that stopped talking.
    uint64_t stall = (uint64_t)(o->bo_com.bo_stall_s * 2e9);
    int wrc = bt_sync_wait(&srv.sv_sync, stall);
    if (wrc != 0) {
        fprintf(stderr, "tpipe: bench pipe server (%s): %s\n", c->bc_label,
                wrc == -2 ? "no progress, giving up" : srv.sv_sync.bs_msg);
        _exit(1);
    }
    // Orderly teardown: it exercises close paths too.
    bp_server_teardown(ctx, &srv);
    _exit(0);
}

// ---- client: measures ------------------------------------------------------

enum { BP_MODE_PING = 1, BP_MODE_STREAM, BP_MODE_QUIT };

typedef struct bp_client bp_client;
typedef struct bp_wslot {
    bp_client *ws_cl;
    tp_aio *ws_aio;
    tp_message ws_msg;
    tp_msg_buf ws_t;
    char ws_md;
} bp_wslot;

struct bp_client {
    bt_sync cl_sync;
    tp_mtx cl_mtx; // the main thread's start vs the loop thread
    const bp_opts *cl_opts;
    tp_pipe *cl_pipe;
    uint8_t *cl_sbuf;
    uint8_t *cl_rbuf;
    uint8_t *cl_spay;
    uint8_t *cl_rpay;
    tp_msg_buf *cl_wp; // payloads of every write (the same source)
    bp_wslot cl_wr[BT_MAX_WINDOW];
    tp_aio *cl_desc;
    tp_aio *cl_rd;
    tp_message *cl_rmsg;
    // measurement parameters (main thread, before a start)
    int cl_mode;
    uint64_t cl_size;
    uint64_t cl_min_iters;
    uint64_t cl_max_iters;
    uint64_t cl_budget_ns;
    unsigned cl_warm;
    unsigned cl_window;
    uint64_t cl_count;
    // ping-pong (loop thread)
    uint64_t cl_round;
    int cl_pending;
    uint64_t cl_t0;
    uint64_t cl_tstart;
    double *cl_lat;
    uint64_t cl_nlat;
    // stream (loop thread)
    uint64_t cl_issued;
    uint64_t cl_completed;
    uint64_t cl_s_t0;
    uint64_t cl_s_t1;
    bool cl_acked;
};

static void bp_cl_wr_cb(void *arg);
static void bp_cl_desc_cb(void *arg);
static void bp_cl_rd_cb(void *arg);

static void
bp_client_fini(bp_client *c)
{
    for (unsigned i = 0; i < BT_MAX_WINDOW; i++) {
        tp_aio_destroy(c->cl_wr[i].ws_aio);
    }
    tp_aio_destroy(c->cl_desc);
    tp_aio_destroy(c->cl_rd);
    tp_message_destroy(c->cl_rmsg);
    free(c->cl_sbuf);
    free(c->cl_rbuf);
    free(c->cl_spay);
    free(c->cl_rpay);
    free(c->cl_wp);
    free(c->cl_lat);
    if (c->cl_opts != NULL) {
        tp__mtx_fini(&c->cl_mtx);
        bt_sync_fini(&c->cl_sync);
    }
    memset(c, 0, sizeof(*c));
}

static bool
bp_client_init(bp_client *c, const bp_opts *o, tp_pipe *p)
{
    memset(c, 0, sizeof(*c));
    bt_sync_init(&c->cl_sync);
    tp__mtx_init(&c->cl_mtx);
    c->cl_opts = o;
    c->cl_pipe = p;
    int64_t tmo = (int64_t)(o->bo_com.bo_stall_s * 1000);
    uint32_t np = o->bo_npayloads;
    c->cl_sbuf = bt_buf_alloc(o->bo_com.bo_max_size);
    c->cl_rbuf = bt_buf_alloc(o->bo_com.bo_max_size);
    c->cl_lat = calloc(o->bo_com.bo_iters, sizeof(double));
    if (c->cl_sbuf == NULL || c->cl_rbuf == NULL || c->cl_lat == NULL ||
        tp_aio_create(bp_cl_desc_cb, c, &c->cl_desc) != TP_OK ||
        tp_aio_create(bp_cl_rd_cb, c, &c->cl_rd) != TP_OK) {
        return false;
    }
    tp_aio_set_timeout(c->cl_desc, tmo);
    tp_aio_set_timeout(c->cl_rd, tmo);
    if (np > 0) {
        c->cl_spay = bt_buf_alloc(np * o->bo_payload_size);
        c->cl_rpay = bt_buf_alloc(np * o->bo_payload_size);
        c->cl_wp = calloc(np, sizeof(tp_msg_buf));
        if (c->cl_spay == NULL || c->cl_rpay == NULL || c->cl_wp == NULL) {
            return false;
        }
        for (uint32_t i = 0; i < np; i++) {
            c->cl_wp[i] = (tp_msg_buf){
                .data = c->cl_spay + i * o->bo_payload_size,
                .len = o->bo_payload_size,
                .device = {.type = TP_DEVICE_CPU},
            };
        }
    }
    for (unsigned i = 0; i < BT_MAX_WINDOW; i++) {
        bp_wslot *w = &c->cl_wr[i];
        w->ws_cl = c;
        if (tp_aio_create(bp_cl_wr_cb, w, &w->ws_aio) != TP_OK) {
            return false;
        }
        tp_aio_set_timeout(w->ws_aio, tmo);
    }
    return true;
}

static void
bp_cl_fail(bp_client *c, const char *what, const tp_aio *aio)
{
    bt_sync_fail(&c->cl_sync, "%s: %s", what,
                 tp_error_message(tp_aio_error(aio)));
}

static void
bp_stamp(uint8_t *buf, uint64_t size, uint64_t v)
{
    memcpy(buf, &v, 8);
    memcpy(buf + size - 8, &v, 8);
}

static bool
bp_stamped(const uint8_t *buf, uint64_t size, uint64_t v)
{
    uint64_t a, b;
    memcpy(&a, buf, 8);
    memcpy(&b, buf + size - 8, 8);
    return a == v && b == v;
}

// Submits a write of @md from slot @i: a tensor of @size bytes (none if
// 0) and, for data messages, the payloads.
static void
bp_cl_write(bp_client *c, unsigned i, char md, uint64_t size)
{
    bp_wslot *w = &c->cl_wr[i];
    w->ws_md = md;
    memset(&w->ws_msg, 0, sizeof(w->ws_msg));
    w->ws_msg.metadata = &w->ws_md;
    w->ws_msg.metadata_len = 1;
    if (size > 0) {
        w->ws_t = (tp_msg_buf){
            .data = c->cl_sbuf, .len = size, .device = {.type = TP_DEVICE_CPU}};
        w->ws_msg.tensors = &w->ws_t;
        w->ws_msg.ntensors = 1;
        w->ws_msg.payloads = c->cl_wp;
        w->ws_msg.npayloads = c->cl_opts->bo_npayloads;
    }
    tp_pipe_write(c->cl_pipe, &w->ws_msg, w->ws_aio);
}

// Locked. One ping-pong round: the write and the echo's read.
static void
bp_cl_round(bp_client *c)
{
    bp_stamp(c->cl_sbuf, c->cl_size, 0x1000 + c->cl_round);
    c->cl_pending = 2;
    c->cl_t0 = tp__now_ns();
    bp_cl_write(c, 0, 'P', c->cl_size);
    tp_pipe_read_descriptor(c->cl_pipe, c->cl_desc);
}

// Locked: one half of a round finished.
static void
bp_cl_part(bp_client *c)
{
    if (--c->cl_pending != 0) {
        return;
    }
    uint64_t t1 = tp__now_ns();
    c->cl_round++;
    if (c->cl_round == c->cl_warm) {
        c->cl_tstart = t1;
    }
    if (c->cl_round > c->cl_warm) {
        c->cl_lat[c->cl_nlat++] = (double)(t1 - c->cl_t0) / 1e3;
    }
    uint64_t measured = c->cl_nlat;
    bool more =
        measured < c->cl_min_iters ||
        (measured < c->cl_max_iters &&
         (c->cl_round <= c->cl_warm || t1 - c->cl_tstart < c->cl_budget_ns));
    if (more) {
        bp_cl_round(c);
    } else {
        bt_sync_done(&c->cl_sync);
    }
}

// Locked: keep cl_window writes in flight until cl_count are issued; the
// last one asks for an ack.
static void
bp_cl_pump(bp_client *c)
{
    while (c->cl_issued < c->cl_count &&
           c->cl_issued - c->cl_completed < c->cl_window) {
        bool last = c->cl_issued + 1 == c->cl_count;
        unsigned slot = (unsigned)(c->cl_issued % c->cl_window);
        c->cl_issued++;
        bp_cl_write(c, slot, last ? 'A' : 'S', c->cl_size);
        if (last) {
            tp_pipe_read_descriptor(c->cl_pipe, c->cl_desc);
        }
    }
}

// Locked. Stream and quit end once the ack arrived and every write
// completed (the next measurement reuses the write aios).
static void
bp_cl_check_done(bp_client *c)
{
    if (c->cl_acked && c->cl_completed == c->cl_issued) {
        bt_sync_done(&c->cl_sync);
    }
}

static void
bp_cl_wr_cb(void *arg)
{
    bp_wslot *w = arg;
    bp_client *c = w->ws_cl;
    bp_bump(&c->cl_sync);
    if (tp_aio_error(w->ws_aio) != NULL) {
        bp_cl_fail(c, "write", w->ws_aio);
        return;
    }
    tp__mtx_lock(&c->cl_mtx);
    if (c->cl_mode == BP_MODE_PING) {
        bp_cl_part(c);
    } else {
        c->cl_completed++;
        if (c->cl_mode == BP_MODE_STREAM) {
            bp_cl_pump(c);
        }
        bp_cl_check_done(c);
    }
    tp__mtx_unlock(&c->cl_mtx);
}

static void
bp_cl_desc_cb(void *arg)
{
    bp_client *c = arg;
    bp_bump(&c->cl_sync);
    if (tp_aio_error(c->cl_desc) != NULL) {
        bp_cl_fail(c, "read descriptor", c->cl_desc);
        return;
    }
    tp_message *m = tp_aio_get_output(c->cl_desc, 0);
    tp__mtx_lock(&c->cl_mtx);
    char want = c->cl_mode == BP_MODE_PING ? 'R' : 'K';
    char op = m->metadata_len == 1 ? *(const char *)m->metadata : '?';
    uint32_t nt = want == 'R' ? 1 : 0;
    uint32_t np = want == 'R' ? c->cl_opts->bo_npayloads : 0;
    bool ok = op == want && m->ntensors == nt && m->npayloads == np &&
              (nt == 0 || m->tensors[0].len == c->cl_size);
    for (uint32_t i = 0; ok && i < np; i++) {
        ok = m->payloads[i].len == c->cl_opts->bo_payload_size;
    }
    if (!ok) {
        tp__mtx_unlock(&c->cl_mtx);
        bt_sync_fail(&c->cl_sync,
                     "unexpected reply (wanted '%c', got metadata %llu "
                     "bytes '%c', %u payloads, %u tensors)",
                     want, (unsigned long long)m->metadata_len, op,
                     m->npayloads, m->ntensors);
        tp_message_destroy(m);
        return;
    }
    if (nt == 1) {
        m->tensors[0].data = c->cl_rbuf;
    }
    for (uint32_t i = 0; i < np; i++) {
        m->payloads[i].data = c->cl_rpay + i * c->cl_opts->bo_payload_size;
    }
    c->cl_rmsg = m;
    tp_pipe_read(c->cl_pipe, m, c->cl_rd);
    tp__mtx_unlock(&c->cl_mtx);
}

static void
bp_cl_rd_cb(void *arg)
{
    bp_client *c = arg;
    bp_bump(&c->cl_sync);
    if (tp_aio_error(c->cl_rd) != NULL) {
        bp_cl_fail(c, "read", c->cl_rd);
        return;
    }
    tp__mtx_lock(&c->cl_mtx);
    tp_message_destroy(c->cl_rmsg);
    c->cl_rmsg = NULL;
    if (c->cl_mode == BP_MODE_PING) {
        uint64_t v = 0x1000 + c->cl_round;
        if (!bp_stamped(c->cl_rbuf, c->cl_size, v)) {
            tp__mtx_unlock(&c->cl_mtx);
            bt_sync_fail(&c->cl_sync,
                         "the echo of round %llu does not carry its stamp",
                         (unsigned long long)c->cl_round);
            return;
        }
        bp_cl_part(c);
    } else {
        if (c->cl_mode == BP_MODE_STREAM) {
            c->cl_s_t1 = tp__now_ns();
        }
        c->cl_acked = true;
        bp_cl_check_done(c);
    }
    tp__mtx_unlock(&c->cl_mtx);
}

// ---- one (combination, repetition) -----------------------------------------

typedef struct bp_run {
    const bp_opts *pr_opts;
    const bp_combo *pr_combo;
    char pr_transport[32]; // negotiated
    char pr_err[2048];
} bp_run;

// Waits for the measurement; on failure writes "<what>: <why>" to pr_err.
static bool
bp_wait(bp_run *r, bp_client *c, const char *what, uint64_t size)
{
    return bench_wait(&c->cl_sync, &r->pr_opts->bo_com, what, size, r->pr_err,
                      sizeof(r->pr_err));
}

static void
bp_start(bp_client *c, int mode)
{
    bt_sync_reset(&c->cl_sync);
    tp__mtx_lock(&c->cl_mtx);
    c->cl_mode = mode;
    if (mode == BP_MODE_PING) {
        c->cl_round = 0;
        c->cl_nlat = 0;
        bp_cl_round(c);
    } else if (mode == BP_MODE_STREAM) {
        c->cl_issued = c->cl_completed = 0;
        c->cl_acked = false;
        c->cl_s_t0 = tp__now_ns();
        bp_cl_pump(c);
    } else {
        c->cl_issued = 1;
        c->cl_completed = 0;
        c->cl_acked = false;
        bp_cl_write(c, 0, 'Q', 0);
        tp_pipe_read_descriptor(c->cl_pipe, c->cl_desc);
    }
    tp__mtx_unlock(&c->cl_mtx);
}

static bool
bp_pingpong(bp_run *r, bp_client *c, uint64_t size, bench_cell *cell)
{
    const bp_opts *o = r->pr_opts;
    c->cl_size = size;
    c->cl_warm = size >= (16u << 20) ? 2 : 20;
    c->cl_min_iters = 10;
    c->cl_max_iters = o->bo_com.bo_iters;
    c->cl_budget_ns = (uint64_t)(o->bo_com.bo_budget * 1e9);
    bp_start(c, BP_MODE_PING);
    if (!bp_wait(r, c, "pingpong", size)) {
        return false;
    }
    bench_cell_pingpong(&o->bo_com, r->pr_combo->bc_label, size, c->cl_lat,
                        (size_t)c->cl_nlat, cell);
    return true;
}

// A stream run of tool_stream_measure.
typedef struct bp_stream_ctx {
    bp_run *ss_run;
    bp_client *ss_client;
    uint64_t ss_size;
} bp_stream_ctx;

static bool
bp_stream_once(void *arg, uint64_t count, double *secs_p)
{
    bp_stream_ctx *s = arg;
    bp_client *c = s->ss_client;
    c->cl_size = s->ss_size;
    c->cl_count = count;
    c->cl_window = s->ss_run->pr_opts->bo_com.bo_window;
    bp_start(c, BP_MODE_STREAM);
    if (!bp_wait(s->ss_run, c, "stream", s->ss_size)) {
        return false;
    }
    *secs_p = (double)(c->cl_s_t1 - c->cl_s_t0) / 1e9;
    return true;
}

// As bench transport (tool_stream_measure): an untimed warm-up of 2W
// messages estimates the rate; the measured run then fills the budget.
static bool
bp_stream(bp_run *r, bp_client *c, uint64_t size, bench_cell *cell)
{
    const bp_opts *o = r->pr_opts;
    bp_stream_ctx s = {.ss_run = r, .ss_client = c, .ss_size = size};
    double bytes =
        (double)size + (double)o->bo_npayloads * (double)o->bo_payload_size;
    return bench_stream(&o->bo_com, r->pr_combo->bc_label, size, bytes,
                        bp_stream_once, &s, cell);
}

// Connects, checks the negotiated combination, measures every size and
// test. Returns BP_SKIP (with pr_err) when the pipe did not negotiate the
// combination asked for.
static bp_outcome
bp_client_run(bp_run *r, const char *url, bench_cell *cells)
{
    const bp_opts *o = r->pr_opts;
    const bp_combo *cb = r->pr_combo;
    static bp_client cl; // large: keep it off the stack
    tp_context *ctx = NULL;
    tp_pipe *p = NULL;
    tp_error *err = NULL;
    bp_outcome out = BP_FAIL;
    bool cl_inited = false;
    if (!bp_context(o, cb, "bench-client", &ctx, r->pr_err,
                    sizeof(r->pr_err))) {
        return BP_SKIP;
    }
    if (tp_context_connect(ctx, url, &p, &err) != TP_OK) {
        snprintf(r->pr_err, sizeof(r->pr_err), "connect to %s: %s", url,
                 tp_error_message(err));
        tp_error_unref(err);
        out = BP_SKIP;
        goto done;
    }
    if (tp_pipe_wait_ready(p, (int64_t)(o->bo_com.bo_stall_s * 1000), &err) !=
        TP_OK) {
        char *rep = tp_context_report(ctx);
        bp_flatten(rep);
        snprintf(r->pr_err, sizeof(r->pr_err),
                 "handshake with %s failed: %s (context: %s)", url,
                 tp_error_message(err), rep ? rep : "no report");
        free(rep);
        tp_error_unref(err);
        out = BP_SKIP;
        goto done;
    }
    {
        const char *tr = tp_pipe_transport(p), *ch = tp_pipe_channel(p);
        tr = tr ? tr : "?";
        ch = ch ? ch : "?";
        snprintf(r->pr_transport, sizeof(r->pr_transport), "%s", tr);
        bool tr_ok = *cb->bc_expect != '\0'
                         ? strcmp(cb->bc_expect, tr) == 0
                         : strstr(cb->bc_transports, tr) != NULL;
        if (!tr_ok || strcmp(ch, cb->bc_channel) != 0) {
            char *rep = tp_pipe_report(p);
            bp_flatten(rep);
            snprintf(r->pr_err, sizeof(r->pr_err), "the pipe chose %s+%s (%s)",
                     tr, ch, rep ? rep : "no report");
            free(rep);
            out = BP_SKIP;
            goto done;
        }
        tool_verbose(o->bo_com.bo_verbose, "bench pipe",
                     "%s: connected to %s over %s+%s", cb->bc_label, url, tr,
                     ch);
    }
    cl_inited = true;
    if (!bp_client_init(&cl, o, p)) {
        snprintf(r->pr_err, sizeof(r->pr_err), "out of memory");
        goto done;
    }
    for (size_t i = 0; i < o->bo_com.bo_nsizes; i++) {
        uint64_t size = o->bo_com.bo_sizes[i];
        if (o->bo_com.bo_pingpong && !bp_pingpong(r, &cl, size, &cells[i])) {
            goto done;
        }
        if (o->bo_com.bo_stream &&
            !bp_stream(r, &cl, size, &cells[o->bo_com.bo_nsizes + i])) {
            goto done;
        }
    }
    bp_start(&cl, BP_MODE_QUIT);
    if (!bp_wait(r, &cl, "quit", 0)) {
        goto done;
    }
    out = BP_OK;
done:
    if (out == BP_FAIL) {
        // A pipe that does not complete its operations on close must not
        // hang the tool.
        tool_install_teardown_alarm("bench pipe",
                                    (unsigned)o->bo_com.bo_stall_s + 10);
    }
    if (p != NULL) {
        tp_pipe_close(p);
    }
    if (cl_inited) {
        bp_client_fini(&cl);
    }
    tp_pipe_unref(p);
    tp_context_destroy(ctx);
    return out;
}

// Both contexts in this process (xth).
static bp_outcome
bp_run_inproc(bp_run *r, bench_cell *cells)
{
    const bp_opts *o = r->pr_opts;
    static bp_server srv;
    tp_context *sctx = NULL;
    char url[512];
    bp_outcome out = bp_server_setup(o, r->pr_combo, &sctx, &srv, url,
                                     sizeof(url), r->pr_err, sizeof(r->pr_err));
    if (out == BP_OK) {
        out = bp_client_run(r, url, cells);
    }
    if (out == BP_OK) {
        int rc = bt_sync_wait(&srv.sv_sync, bench_stall_ns(&o->bo_com));
        if (rc != 0) {
            snprintf(r->pr_err, sizeof(r->pr_err), "server: %s",
                     rc == -2 ? "no progress" : srv.sv_sync.bs_msg);
            out = BP_FAIL;
        }
    }
    if (out == BP_FAIL) {
        tool_install_teardown_alarm("bench pipe",
                                    (unsigned)o->bo_com.bo_stall_s + 10);
    }
    bp_server_teardown(sctx, &srv);
    alarm(0);
    return out;
}

static bp_outcome
bp_run_rep(bp_run *r, bench_cell *cells)
{
    const bp_opts *o = r->pr_opts;
    if (r->pr_combo->bc_inproc) {
        return bp_run_inproc(r, cells);
    }
    int fd;
    pid_t pid = bench_fork_server(&fd, r->pr_err, sizeof(r->pr_err));
    if (pid < 0) {
        return BP_FAIL;
    }
    if (pid == 0) {
        bp_server_child(o, r->pr_combo, fd);
    }
    char line[1600];
    int64_t tmo = (int64_t)(o->bo_com.bo_stall_s * 1000);
    tool_line_status ls =
        tool_read_line(fd, tp__deadline_after_ms(tmo), line, sizeof(line),
                       r->pr_err, sizeof(r->pr_err));
    if (ls == TOOL_LINE_TIMEOUT) {
        snprintf(r->pr_err, sizeof(r->pr_err),
                 "server sent nothing within %lld ms", (long long)tmo);
    } else if (ls == TOOL_LINE_EOF) {
        snprintf(r->pr_err, sizeof(r->pr_err),
                 "server exited before reporting its URL");
    }
    bool got = ls == TOOL_LINE_OK;
    close(fd);
    if (!got || strncmp(line, "OK ", 3) != 0) {
        bp_outcome out = BP_FAIL;
        if (got) {
            out = strncmp(line, "SKIP ", 5) == 0 ? BP_SKIP : BP_FAIL;
            const char *why = strchr(line, ' ');
            snprintf(r->pr_err, sizeof(r->pr_err), "server: %s",
                     why ? why + 1 : line);
        }
        tool_reap(pid, 1000, !got);
        return out;
    }
    tool_verbose(o->bo_com.bo_verbose, "bench pipe",
                 "%s: server %d listens on %s", r->pr_combo->bc_label, (int)pid,
                 line + 3);
    bp_outcome out = bp_client_run(r, line + 3, cells);
    // After a skip or a failure the server has nothing left to do.
    if (!bench_reap_server(pid, out == BP_OK, r->pr_err, sizeof(r->pr_err)) &&
        out == BP_OK) {
        out = BP_FAIL;
    }
    alarm(0);
    return out;
}

// ---- ceilings for the plot -------------------------------------------------

// Single-thread memcpy of 256 MiB (as ../shared/peers/memcpy_bw.c): the
// median of 5 copies after a warm-up, GB/s of bytes copied.
static double
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
static double
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

static void
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
static double
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
static bool
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

// ---- main ------------------------------------------------------------------

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

    size_t ncells = 2 * o.bo_com.bo_nsizes;
    bench_cell *cells = calloc(ncells, sizeof(*cells));
    double *vals = calloc(ncells * 4 * o.bo_com.bo_reps, sizeof(double));
    bp_result *res = calloc(o.bo_ncombos, sizeof(*res));
    double *gbps = calloc(o.bo_ncombos * o.bo_com.bo_nsizes, sizeof(double));
    if (cells == NULL || vals == NULL || res == NULL || gbps == NULL) {
        tool_err("out of memory");
        free(cells);
        free(vals);
        free(res);
        free(gbps);
        return TOOL_EXIT_FAIL;
    }
    bp_print_header(&o);
    bool failed = false;
    size_t measured = 0;
    for (size_t ci = 0; ci < o.bo_ncombos; ci++) {
        const bp_combo *cb = &o.bo_combos[ci];
        bp_result *pr = &res[ci];
        pr->pr_combo = cb;
        pr->pr_stream_gbps = gbps + ci * o.bo_com.bo_nsizes;
        for (size_t i = 0; i < o.bo_com.bo_nsizes; i++) {
            pr->pr_stream_gbps[i] = NAN;
        }
        // A transport that cannot work here is skipped before forking.
        char why[256] = "";
        if (!tool_backend_viable(TOOL_TRANSPORT, cb->bc_connect, why,
                                 sizeof(why))) {
            fprintf(stderr,
                    "tpipe: bench pipe: skipping %s: transport %s: %s\n",
                    cb->bc_label, cb->bc_connect, why);
            continue;
        }
        if (!tool_backend_viable(TOOL_CHANNEL, cb->bc_channel, why,
                                 sizeof(why))) {
            fprintf(stderr, "tpipe: bench pipe: skipping %s: channel %s: %s\n",
                    cb->bc_label, cb->bc_channel, why);
            continue;
        }
        bench_cells_reset(cells, ncells, vals, o.bo_com.bo_reps);
        static bp_run r;
        memset(&r, 0, sizeof(r));
        r.pr_opts = &o;
        r.pr_combo = cb;
        bp_outcome out = BP_OK;
        for (unsigned rep = 0; rep < o.bo_com.bo_reps && out == BP_OK; rep++) {
            tool_verbose(o.bo_com.bo_verbose, "bench pipe",
                         "%s: repetition %u of %u", cb->bc_label, rep + 1,
                         o.bo_com.bo_reps);
            out = bp_run_rep(&r, cells);
        }
        if (out == BP_SKIP) {
            fflush(stdout);
            fprintf(stderr, "tpipe: bench pipe: skipping %s: %s\n",
                    cb->bc_label, r.pr_err);
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
        for (int test = 0; test < 2; test++) {
            for (size_t i = 0; i < o.bo_com.bo_nsizes; i++) {
                double g = bp_print_cell(&o, cb, r.pr_transport,
                                         test == 0 ? "pingpong" : "stream",
                                         o.bo_com.bo_sizes[i],
                                         &cells[test * o.bo_com.bo_nsizes + i]);
                if (test == 1) {
                    pr->pr_stream_gbps[i] = g;
                }
            }
        }
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
    free(cells);
    free(vals);
    free(res);
    free(gbps);
    return failed ? TOOL_EXIT_FAIL : TOOL_EXIT_OK;
}
