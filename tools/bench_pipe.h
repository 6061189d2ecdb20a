/* SPDX-License-Identifier: Apache-2.0 */
/* bench_pipe.h (internal) - what the files of `tpipe bench pipe` share:
 * bench_pipe.c (main, the modes across hosts), bench_pipe_opts.c (the
 * options), bench_pipe_server.c (the echo and sink server, in a forked
 * child or in this process), bench_pipe_client.c (the client that
 * measures, one combination and repetition), bench_pipe_msgrate.c (--test
 * msgrate's pairs), bench_pipe_dev.c (--device: CUDA tensors, the
 * cudaMemcpy baseline) and bench_pipe_plot.c (the ceilings, the rows and
 * the SVG). */
#ifndef TP_TOOLS_BENCH_PIPE_H
#define TP_TOOLS_BENCH_PIPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tpipe/pipe.h>
#include <tpipe/store.h>

#include "bench_common.h"
#include "bench_out.h"
#include "bench_peer.h"

#define BP_MAX_NAMES     16
#define BP_MAX_COMBOS    32
#define BP_MAX_PAYLOADS  64u
#define BP_MAX_PAYLOAD   (64u << 20)
#define BP_MAX_PAIRS     64
#define BP_MSGRATE_SIZES "16,64,256,1K,4K"
// Exit status of a run that cannot measure here (--device cuda:N without a
// usable CUDA runtime or device), as the tests' "skipped".
#define BP_EXIT_SKIP 77
// The stamp of every stream and bibw message's first and last 8 bytes; the
// server checks it on the last one ('A', 'a').
#define BP_STREAM_STAMP 0x53545245414d5354ull

// One transport/channel combination.
typedef struct bp_combo {
    char bc_transports[64]; // allow list of both contexts: "tcp", "tcp,shm"
    char bc_connect[16];    // transport whose listener URL the client dials
    char bc_expect[16];     // the transport the pipe must choose ("" = any)
    char bc_channel[16];
    bool bc_inproc; // both contexts in this process (xth)
    bool bc_remote; // the peer is another tpipe (--listen/--connect/launched)
    char bc_label[96];
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
    // Across hosts: this side serves (--listen, launched rank 1) or
    // measures against bo_connect (--connect, launched rank 0).
    bool bo_listen;
    const char *bo_connect;
    const char *bo_bind; // the server's tcp host; NULL = the library's
    bool bo_launched;
    int bo_rank;
    int bo_world; // launched: WORLD_SIZE (2, or 2 x pairs for msgrate)
    // --test msgrate: bo_pairs pairs stream at once (bo_com.bo_stream).
    bool bo_msgrate;
    unsigned bo_pairs;
    // --test bibw: the stream test both ways at once (bo_com.bo_stream).
    bool bo_bibw;
    // --device: where the measuring side's tensors are (bo_src: it sends
    // them) and where the serving side receives them (bo_dst). bo_cuda:
    // either is a CUDA device.
    const char *bo_device;
    // --device-channel: the device channel the contexts allow beside the
    // pipe's channel (NULL: every one built; "none": CUDA tensors staged).
    const char *bo_device_channel;
    tp_device bo_src;
    tp_device bo_dst;
    bool bo_cuda;
    int bo_ndev; // CUDA devices here (bo_cuda only)
} bp_opts;

// What a combination produced, for the output and the plot.
typedef struct bp_result {
    const bp_combo *pr_combo;
    char pr_transport[32]; // the one negotiated
    bool pr_ok;
    double *pr_stream_gbps; // [nsizes], NAN where not measured
    double *pr_p50_us;      // [nsizes], pingpong
} bp_result;

typedef enum bp_outcome { BP_OK, BP_SKIP, BP_FAIL } bp_outcome;

// ---- the server (bench_pipe_server.c) --------------------------------------

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

// Counts progress on @s (the stall deadline's).
void bp_bump(bt_sync *s);
// A context for combination @c. Returns false with @why set.
bool bp_context(const bp_opts *o, const bp_combo *c, const char *name,
                tp_context **ctx_p, char *why, size_t why_len);
// The report as one line ("a; b; c"), for error messages.
void bp_flatten(char *s);
// Creates the server's context and listener, allocates and starts
// accepting; writes the URL to dial into @url. BP_SKIP or BP_FAIL with
// @why set; whatever was created is left for bp_server_teardown.
bp_outcome bp_server_setup(const bp_opts *o, const bp_combo *c,
                           tp_context **ctx_p, bp_server *s, char *url,
                           size_t url_len, char *why, size_t why_len);
void bp_server_teardown(tp_context *ctx, bp_server *s);
// The forked server of the bp_run @arg: never returns.
void bp_server_child(void *arg, int wfd);

// ---- the client (bench_pipe_client.c) --------------------------------------

// One (combination, repetition).
typedef struct bp_run {
    const bp_opts *pr_opts;
    const bp_combo *pr_combo;
    char pr_transport[32]; // negotiated
    char pr_dchannel[32];  // the device channel negotiated ("" none)
    char pr_err[2048];
} bp_run;

// Runs one repetition of r->pr_combo, recording into @cells (pingpong
// cells, then stream cells, one per size). BP_SKIP or BP_FAIL with
// r->pr_err set.
bp_outcome bp_run_rep(bp_run *r, bench_cell *cells);

// Measures one repetition against the server at @url (another tpipe
// process, --connect or launched): no fork.
bp_outcome bp_run_remote(bp_run *r, const char *url, bench_cell *cells);

// --test msgrate (bench_pipe_msgrate.c): o->bo_pairs forked pairs at once;
// the stream cells get the sums of their GB/s. BP_SKIP or BP_FAIL with
// r->pr_err set.
bp_outcome bp_msgrate(bp_run *r, bench_cell *cells);
// Launched msgrate, rank 0 (bench_pipe_msgrate.c): measures its pair
// against @url once every pair is ready, then adds the rates the other
// measuring ranks put in @st; the stream cells get the sums.
bp_outcome bp_msgrate_launched(bp_run *r, tp_store *st, const char *url,
                               bench_cell *cells);
// Launched msgrate, a measuring rank but rank 0: measures against @url,
// hands its rates (or its failure) to rank 0 through @st. The exit status.
int bp_msgrate_pair(const bp_opts *o, tp_store *st, const char *url);

// ---- --device (bench_pipe_dev.c) ------------------------------------------

// Parses o->bo_device and, when it names a CUDA device, asks a forked
// child whether CUDA is usable here and how many devices there are
// (bo_ndev). Returns -1 to continue, else the exit status (2: bad spec,
// or a test that takes none; BP_EXIT_SKIP: CUDA not usable here), with
// one line printed.
int bp_dev_check(bp_opts *o);
// Once the mode is known (bp_remote_opts): the devices this side uses
// exist here (both locally, the destination when serving, the source when
// measuring against another tpipe). -1, or 2 with the error printed.
int bp_dev_check_indices(const bp_opts *o);
// "cpu", "cuda:1".
void bp_dev_name(tp_device d, char *buf, size_t len);
// A buffer of @n bytes on @d (CPU: bt_buf_alloc). NULL on failure, with
// @why set.
uint8_t *bp_buf_alloc(tp_device d, uint64_t n, char *why, size_t why_len);
void bp_buf_free(tp_device d, uint8_t *p);
// The stamp of the tensor's first and last 8 bytes (as the pingpong and
// the last stream message carry): writes @v into @buf of @size bytes on
// @d, or reads it (true with *@ok_p when both words are @v). False with
// @why when a copy failed.
bool bp_stamp_put(tp_device d, uint8_t *buf, uint64_t size, uint64_t v,
                  char *why, size_t why_len);
bool bp_stamp_check(tp_device d, const uint8_t *buf, uint64_t size, uint64_t v,
                    bool *ok_p, char *why, size_t why_len);
// Memory shared with forked children (MAP_SHARED), zeroed; NULL on failure.
void *bp_shared_alloc(size_t n);
void bp_shared_free(void *p, size_t n);
// One local repetition as bp_run_rep, in a forked child: with CUDA, a
// process must not fork after its first CUDA call (the child could not use
// the device), so this process never makes one before its last fork. The
// cells must be bp_shared_alloc'ed; the rows of the cells completed are
// printed here (o->bo_com.bo_done_fn).
bp_outcome bp_run_rep_isolated(bp_opts *o, bp_run *r, bench_cell *cells);
// The baseline rows: cudaMemcpy of every size, source to destination
// device (device-to-device on the CUDA device, plus host-to-device or
// device-to-host for a CPU/CUDA pair), median of the repetitions; against
// another tpipe (--connect, launched) only with this side's source device
// (none when it is the CPU), the destination standing for the server's.
// False
// (with the error printed) when a copy failed.
bool bp_dev_baseline(const bp_opts *o, bench_out *out);

// ---- options (bench_pipe_opts.c) -------------------------------------------

// Parses and checks the options into @o. Returns -1 to continue, else the
// exit status (after printing the usage or the error).
int bp_parse_args(int argc, char **argv, bp_opts *o);

// ---- output (bench_pipe_plot.c) --------------------------------------------

// Single-thread memcpy of 256 MiB and a raw loopback TCP stream for @secs:
// GB/s, NAN when not measurable.
double bp_memcpy_gbps(void);
double bp_tcp_gbps(double secs);
// The rows: the table or JSON lines of @o.
void bp_out_init(const bp_opts *o, bench_out *out);
// Prints one cell (its medians) of combination @cb, which negotiated
// transport @tr; returns the median GB/s (stream) or p50 us (pingpong).
double bp_print_cell(bench_out *out, const bp_opts *o, const bp_combo *cb,
                     const char *tr, const char *dch, bench_cell *cell);
// Prints a baseline row: cudaMemcpy of @size bytes from @src to @dst,
// @test ("copy_d2d", ...), the median GB/s over @reps of @iters copies.
void bp_print_copy(bench_out *out, const bp_opts *o, const char *test,
                   tp_device src, tp_device dst, uint64_t size, double gbps,
                   uint64_t iters, unsigned reps);
// Writes the SVG: stream GB/s with the ceilings, pingpong p50 beside it;
// false (with errno) when it cannot.
bool bp_write_svg(const bp_opts *o, const bp_result *res, size_t nres,
                  double memcpy_gbps, double tcp_gbps);

#endif
