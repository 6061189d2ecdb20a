/* SPDX-License-Identifier: Apache-2.0 */
/* bench_peer.h - the two ends of `tpipe bench transport`: a server (echo
 * and sink, in the forked child) and a client (the measuring parent).
 * Everything after the start of a measurement runs chained in aio
 * callbacks on the loop thread of each process: the client issues its next
 * write from its read completion, the server its echo from its read
 * completion. The main thread only starts a measurement and waits for it
 * with a stall deadline.
 *
 * Wire protocol (little-endian, over the transport's byte stream):
 *   control, client -> server, BT_CTRL_LEN bytes:
 *     u32 magic BT_MAGIC, u32 op, u64 size, u64 count, u64 window
 *   BT_OP_PING:   then messages of `size` bytes, each echoed back; the
 *                 first and last 8 bytes carry a stamp (round number); a
 *                 stamp with BT_STOP set ends the ping-pong after its echo.
 *   BT_OP_STREAM: then exactly `count` messages of `size` bytes; after the
 *                 last one the server sends an ack (u64 count, u64 0).
 *   BT_OP_IDLE:   the server notes its CPU time and waits for the next
 *                 control message (a pending read, nothing sent).
 *   BT_OP_IDLE_END: the server acks (u64 cpu_ns, u64 wall_ns) since IDLE.
 *   BT_OP_QUIT:   the server acks (0, 0) and exits.
 */
#ifndef TP_TOOLS_BENCH_PEER_H
#define TP_TOOLS_BENCH_PEER_H

#include <stdbool.h>
#include <stdint.h>

#include "core/aio.h"
#include "core/loop.h"
#include "transport/transport.h"

#define BT_MAGIC        0x54425054u // "TPBT"
#define BT_CTRL_LEN     32u
#define BT_ACK_LEN      16u
#define BT_MAX_WINDOW   64u
#define BT_STOP         (UINT64_C(1) << 63)
#define BT_STREAM_STAMP UINT64_C(0x53545245414d0000)
#define BT_MIN_SIZE     16u // room for the first and last 8-byte stamps

enum {
    BT_OP_PING = 1,
    BT_OP_STREAM = 2,
    BT_OP_IDLE = 3,
    BT_OP_IDLE_END = 4,
    BT_OP_QUIT = 5,
};

// How the main thread waits for work chained on a loop thread.
typedef struct bt_sync {
    tp_mtx bs_mtx;
    tp_cv bs_cv;
    bool bs_done;
    bool bs_failed;
    char bs_msg[1024];            // first error
    _Atomic uint64_t bs_progress; // bumped by every callback
} bt_sync;

void bt_sync_init(bt_sync *s);
void bt_sync_fini(bt_sync *s);
void bt_sync_reset(bt_sync *s);
// Loop thread: the work is finished.
void bt_sync_done(bt_sync *s);
// Any thread: record the first error and finish.
void bt_sync_fail(bt_sync *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
bool bt_sync_failed(bt_sync *s);
// Waits until done. Returns 0 when done without error, -1 on error (the
// message is in bs_msg), -2 when no callback ran for @stall_ns.
int bt_sync_wait(bt_sync *s, uint64_t stall_ns);

// Allocates @n bytes aligned to 4 KiB, touched so that no page fault
// lands inside a measurement. NULL on failure. Free with free().
uint8_t *bt_buf_alloc(uint64_t n);

// ---- server ----------------------------------------------------------------

typedef struct bt_server bt_server;
typedef struct bt_slot {
    tp_aio sl_aio;
    bt_server *sl_srv;
    unsigned sl_idx;
} bt_slot;

struct bt_server {
    bt_sync sv_sync;
    tp_loop *sv_loop;
    tp_listener *sv_listener;
    tp_conn *sv_conn;
    uint64_t sv_max_size;
    unsigned sv_nbufs;
    uint8_t *sv_bufs[BT_MAX_WINDOW + 1];
    bt_slot sv_slots[BT_MAX_WINDOW + 1]; // stream reads, one per buffer
    tp_aio sv_accept;
    tp_aio sv_rd; // control and ping-pong reads
    tp_aio sv_wr; // echoes and acks
    uint8_t sv_ctrl[BT_CTRL_LEN];
    uint8_t sv_ack[BT_ACK_LEN];
    // the operation in progress (loop thread)
    unsigned sv_op;
    bool sv_rd_data; // sv_rd reads a ping message (else control)
    uint64_t sv_size;
    uint64_t sv_count;
    unsigned sv_cur; // buffer of the ping read in flight
    bool sv_wr_busy;
    bool sv_echo_pending;
    unsigned sv_echo_buf;
    bool sv_ack_pending;
    bool sv_quitting;
    uint64_t sv_posted;
    uint64_t sv_received;
    uint64_t sv_idle_cpu_ns;
    uint64_t sv_idle_wall_ns;
};

// Allocates buffers (@nbufs of @max_size) and inits the aios.
int bt_server_init(bt_server *s, tp_loop *loop, tp_listener *l,
                   uint64_t max_size, unsigned nbufs);
// Any thread: accept one connection and serve it until QUIT or an error.
void bt_server_start(bt_server *s);
void bt_server_fini(bt_server *s);

// ---- client ----------------------------------------------------------------

typedef struct bt_client bt_client;
typedef struct bt_wslot {
    tp_aio ws_aio;
    bt_client *ws_cl;
} bt_wslot;

struct bt_client {
    bt_sync cl_sync;
    tp_loop *cl_loop;
    tp_conn *cl_conn;
    uint8_t *cl_sbuf;
    uint8_t *cl_rbuf;
    uint64_t cl_max_size;
    tp_aio cl_cw; // control writes
    uint8_t cl_ctrl[BT_CTRL_LEN];
    tp_aio cl_ackrd;
    uint8_t cl_ack[BT_ACK_LEN];
    tp_aio cl_rd;
    tp_aio cl_wr;
    bt_wslot cl_swr[BT_MAX_WINDOW]; // stream writes in flight
    // measurement parameters (set by the main thread before a start)
    uint64_t cl_size;
    uint64_t cl_min_iters;
    uint64_t cl_max_iters;
    uint64_t cl_budget_ns;
    unsigned cl_warm;
    unsigned cl_window;
    uint64_t cl_count; // stream: messages
    // ping-pong state (loop thread)
    uint64_t cl_round;
    uint64_t cl_stamp;
    int cl_pending;
    bool cl_stopping;
    uint64_t cl_t0;
    uint64_t cl_tstart;
    double *cl_lat; // measured round trips, us
    uint64_t cl_nlat;
    uint64_t cl_lat_cap;
    // stream state (loop thread)
    uint64_t cl_issued;
    uint64_t cl_completed;
    bool cl_acked;
    uint64_t cl_s_t0;
    uint64_t cl_s_t1;
    // ack values of the last IDLE_END / QUIT
    uint64_t cl_ack_a;
    uint64_t cl_ack_b;
    // control state (loop thread)
    unsigned cl_mode; // BT_OP_* of the measurement in progress
    bool cl_ack_posted;
    bool cl_ack_wanted;
    bool cl_ack_done;
    bool cl_cw_done;
};

int bt_client_init(bt_client *c, tp_loop *loop, tp_conn *conn,
                   uint64_t max_size, uint64_t max_iters);
void bt_client_fini(bt_client *c);
// Any thread: start a measurement; then bt_sync_wait(&c->cl_sync, ...).
// Ping-pong of cl_size: results in cl_lat[0..cl_nlat).
void bt_client_start_pingpong(bt_client *c);
// Stream cl_count messages of cl_size with cl_window in flight: time in
// cl_s_t0..cl_s_t1.
void bt_client_start_stream(bt_client *c);
// Send one control @op that the server acks (IDLE_END, QUIT): the ack
// values land in cl_ack_a/b. With @ack false (IDLE) the ack read is left
// pending and the call is done once the control message is written.
void bt_client_start_ctrl(bt_client *c, unsigned op, bool ack);

#endif
