/* SPDX-License-Identifier: Apache-2.0 */
/* bench_rpc.h (internal) - what the files of `tpipe bench rpc` share:
 * bench_rpc.c (options, output, main), bench_rpc_run.c (the worker
 * processes and the measurements), bench_rpc_rref.c (the RRef tests) and
 * bench_rpc_autograd.c (distributed autograd). */
#ifndef TP_TOOLS_BENCH_RPC_H
#define TP_TOOLS_BENCH_RPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tpipe/info.h>
#include <tpipe/rpc.h>

#include "bench_common.h"

#define BR_MAX_TRANSPORTS TP_INFO_MAX
#define BR_MAX_SIZES      16
#define BR_MIN_NOOP       100u     // noop calls measured at least
#define BR_MAX_NOOP       5000000u // ... and at most
#define BR_MIN_ECHO       5u
#define BR_MIN_ASYNC      640u
#define BR_MAX_INFLIGHT   1024u
#define BR_DEFAULT_SIZES  "64,1M,64M"

// The allow list each --transport name puts in tp_agent_options.transports.
// "shm" alone: the agent then listens and dials on shm only, so the pipe
// cannot end up on tcp.
typedef struct br_transport {
    const char *bt_name;  // --transport, the JSON "transport" (static)
    const char *bt_allow; // tp_agent_options.transports
} br_transport;

typedef struct br_opts {
    br_transport bo_tr[BR_MAX_TRANSPORTS];
    size_t bo_ntr;
    bool bo_all_tr;
    const char *bo_channel; // NULL: every channel
    bool bo_noop, bo_echo, bo_async, bo_init, bo_remote, bo_fork, bo_autograd;
    bool bo_fork_named; // rref_fork named in --test (not only by "all")
    uint64_t bo_sizes[BR_MAX_SIZES];
    size_t bo_nsizes;
    double bo_budget;
    unsigned bo_reps;
    unsigned bo_inflight;
    double bo_stall_s;
    bool bo_json;
    bool bo_verbose;
    // A rank of a launched job (RANK, WORLD_SIZE; --launched): rank 0
    // measures, the others serve; one agent for every repetition.
    bench_launch bo_launch;
} br_opts;

// Statistics of one cell (a test and size) per repetition.
enum {
    BR_F_P50,
    BR_F_P10,
    BR_F_P90,
    BR_F_MIN,
    BR_F_MAX,
    BR_F_GBPS,
    BR_F_CPS,
    BR_F_RANKS_MAX, // init: the slower of the two ranks
    BR_F_CALLS,
    BR_NF
};

// Cells: noop, async, init, remote, rref_fork, dist_autograd, then one per
// echo size.
enum {
    BR_C_NOOP,
    BR_C_ASYNC,
    BR_C_INIT,
    BR_C_REMOTE,
    BR_C_FORK,
    BR_C_AUTOGRAD,
    BR_C_ECHO
};

// One transport's repetitions.
typedef struct br_run {
    const br_opts *rr_opts;
    const br_transport *rr_tr;
    size_t rr_ncells;
    double *rr_vals; // [cell][field][rep]
    unsigned rr_nreps;
    char rr_channel[16]; // negotiated, from the last repetition
    char rr_transport[16];
    int rr_base_threads; // threads of this process before any agent
    bool rr_fork_pass;   // this pass measures rref_fork only (3 workers)
    char rr_err[1024];
} br_run;

static inline double *
br_val(br_run *r, size_t cell, int field, unsigned rep)
{
    return &r->rr_vals[(cell * BR_NF + (size_t)field) * r->rr_opts->bo_reps +
                       rep];
}

// The workers of a repetition: rref_fork runs in a pass of its own with
// a third worker (so that init stays a 2-worker init).
static inline int
br_world(const br_run *r)
{
    return r->rr_fork_pass ? 3 : 2;
}

// Latency samples of one measurement, in us.
typedef struct br_lat {
    double *bl_v;
    size_t bl_n, bl_cap;
} br_lat;

bool br_lat_add(br_lat *l, double us);
// Stores the latency statistics of @l as repetition @rep of @cell.
void br_lat_record(br_run *r, size_t cell, unsigned rep, br_lat *l,
                   double size);
// Arms the watchdog for @what; br_watch_again re-arms it (progress).
void br_watch(const br_opts *o, const char *tr, const char *what);
void br_watch_again(void);
// Writes "<what>: <message>" of @err to @buf and drops @err.
void br_error(char *buf, size_t len, tp_status st, tp_error *err,
              const char *fmt, ...) __attribute__((format(printf, 5, 6)));
// One timed operation of a latency test: what it does (@bo_run: TP_OK,
// or a status and *err_p; what it leaves in *keep_p goes to @bo_drop,
// untimed) and its names for messages.
typedef struct br_op {
    const char *bo_test; // "noop"
    const char *bo_what; // "rpc_sync(worker1, \"tp.noop\")"
    tp_status (*bo_run)(tp_agent *a, void *arg, void **keep_p,
                        tp_error **err_p);
    void (*bo_drop)(void *keep);
    void *bo_arg;
} br_op;

// Runs @op 100 times, then for the budget (at least 100 times), and
// records the latencies as repetition @rep of @cell. False after writing
// what failed to r->rr_err.
bool br_measure_lat(br_run *r, tp_agent *a, unsigned rep, size_t cell,
                    const br_op *op);
// bench_rpc_rref.c: remote() + to_here, and an RRef to worker2 and back.
bool br_measure_remote(br_run *r, tp_agent *a, unsigned rep);
bool br_measure_fork(br_run *r, tp_agent *a, unsigned rep);
// bench_rpc_autograd.c: registers "bench.mul" (y = x * w, recorded) in
// this process, before any worker is forked. False after writing what
// failed to @err.
bool br_autograd_register(char *err, size_t len);
// One distributed autograd iteration (PyTorch's dist_autograd_fwd_bwd).
bool br_measure_autograd(br_run *r, tp_agent *a, unsigned rep);

// One repetition: a fresh pair of processes. False after writing what
// failed to r->rr_err.
bool br_run_rep(br_run *r, unsigned rep);
// bench_rpc_run.c, shared with the launched run: the agent's options, the
// measurements of one repetition (the 2-worker tests, or rref_fork), and
// the check of the pipe to worker1. False after writing to r->rr_err.
void br_agent_options(const br_opts *o, const br_transport *tr,
                      const char *init, int64_t shutdown_ms,
                      tp_agent_options *ao);
bool br_measure_all(br_run *r, tp_agent *a, unsigned rep, bool fork_pass);
bool br_check_pipe(br_run *r, tp_agent *a);
// bench_rpc_launch.c: this process is rank o->bo_launch.bl_rank of a
// launched job. Rank 0 runs every repetition (the 2-worker tests, then
// rref_fork) on one agent and leaves r->rr_nreps set; the others serve
// until rank 0 shuts down. False after writing to r->rr_err.
bool br_run_launched(br_run *r);
// The threads of this process (0 if unknown).
int br_thread_count(void);

#endif
