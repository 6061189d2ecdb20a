/* SPDX-License-Identifier: Apache-2.0 */
/* bench_collective.h (internal) - what the files of `tpipe bench
 * collective` share: bench_collective.c (the ops, options, main),
 * bench_collective_rank.c (a forked rank: checks and measures),
 * bench_collective_run.c (a repetition: forks the ranks, collects their
 * lines) and bench_collective_out.c (the table, JSON lines and plot). */
#ifndef TP_TOOLS_BENCH_COLLECTIVE_H
#define TP_TOOLS_BENCH_COLLECTIVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <tpipe/collectives.h>
#include <tpipe/tpipe.h>

#include "bench_common.h"
#include "bench_out.h"

#define BC_MAX_WORLD     64
#define BC_MAX_SIZES     64
#define BC_MAX_REPS      1000
#define BC_MIN_ITERS     5
#define BC_MAX_ITERS     10000000u
#define BC_MAX_SIZE      (UINT64_C(1) << 32)
#define BC_DEFAULT_SIZES "4K,64K,1M,16M,64M"
#define BC_LINE_MAX      1024 // < PIPE_BUF: one atomic write per line
#define BC_ERROR_GRACE_S 3.0  // after a rank's error, the others' time

// ---- ops -------------------------------------------------------------------

typedef enum bc_kind {
    BC_ALL_REDUCE,
    BC_ALL_GATHER,
    BC_REDUCE_SCATTER,
    BC_BROADCAST,
    BC_REDUCE,
    BC_ALL_TO_ALL,
    BC_BARRIER,
    BC_GATHER,
    BC_SCATTER,
    BC_NKINDS
} bc_kind;

// How busbw follows from algbw (nccl-tests' factors, n = world size).
typedef enum bc_bus {
    BC_BUS_ALLREDUCE, // 2(n-1)/n
    BC_BUS_SPREAD,    // (n-1)/n
    BC_BUS_ONE,       // 1
    BC_BUS_NONE,      // barrier: no bytes
} bc_bus;

typedef struct bc_op {
    const char *op_name;
    const char *op_call; // for error messages
    bool op_blocked;     // the buffer is n blocks: count % n == 0
    bc_bus op_bus;
} bc_op;

extern const bc_op bc_ops[BC_NKINDS];

// busbw / algbw for op @k in a world of @n (nccl-tests' factors).
double bc_bus_factor(bc_kind k, int n);

// ---- options ---------------------------------------------------------------

typedef struct bc_opts {
    bc_kind bo_ops[BC_NKINDS];
    size_t bo_nops;
    int bo_world;
    uint64_t bo_sizes[BC_MAX_SIZES];
    size_t bo_nsizes;
    tp_dtype bo_dtype;
    uint64_t bo_iters; // 0: calibrated
    unsigned bo_warmup;
    unsigned bo_reps;
    const char *bo_engine; // "auto", "shm", "pipe"
    bool bo_tcp;           // --store tcp
    double bo_budget;      // seconds per measurement (calibrated iters)
    double bo_timeout_s;   // per repetition
    bool bo_json;
    bool bo_verbose;
    bool bo_no_bind; // --no-bind: leave placement to the scheduler
    const char *bo_plot;
    // A rank of a launched job (RANK, WORLD_SIZE; --launched): this
    // process forks only its own rank, which meets the others through
    // bl_url and runs every repetition in one group.
    bench_launch bo_launch;
} bc_opts;

// One measurement: an op at one size (barrier: one, size 0).
typedef struct bc_cell {
    bc_kind c_kind;
    uint64_t c_size;  // bytes of the op's main buffer (see bc_usage)
    uint64_t c_count; // elements of that buffer
    uint64_t c_block; // blocked ops: elements per rank block, else c_count
} bc_cell;

// Parses the arguments into @o: -1 to go on, else the exit status.
int bc_parse_args(int argc, char **argv, bc_opts *o);
// The measurements, in order: for each op, each size (barrier: one).
// Returns how many were stored in @cells (room for nops * nsizes).
size_t bc_cells(const bc_opts *o, bc_cell *cells);
// "all_reduce, size 4K (4096 bytes)", "barrier": for messages.
void bc_cell_name(const bc_cell *c, char *buf, size_t len);

// ---- a rank (bench_collective_rank.c) ----------------------------------

// A rank's life: join the group at @url, measure every cell (launched:
// --reps times), report "done" on @fd. Never returns.
void bc_rank_main(const bc_opts *o, const bc_cell *cells, size_t ncells,
                  int rank, const char *url, int fd) __attribute__((noreturn));

// ---- the repetitions (bench_collective_run.c) --------------------------

// Results of all repetitions: [cell][rep].
typedef struct bc_results {
    size_t rs_ncells;
    unsigned rs_reps;
    double *rs_time; // us
    double *rs_iters;
    char rs_engine[16];
    bench_out rs_out; // the rows; set up by the first (bc_print_row)
} bc_results;

// The state of one repetition in this process.
typedef struct bc_rep {
    const bc_opts *rp_opts;
    const bc_cell *rp_cells;
    size_t rp_ncells;
    unsigned rp_rep;
    bc_results *rp_res;
    int rp_first;  // the rank of rp_pid[0] (launched: this job's rank)
    int rp_nlocal; // ranks this process forks
    pid_t rp_pid[BC_MAX_WORLD];
    bool rp_done[BC_MAX_WORLD]; // said "done"
    int rp_ndone;
    size_t rp_nresults;
    char rp_err[4096]; // every rank's error, "; "-separated
    bool rp_failed;
    char rp_buf[8192];
    size_t rp_len;
} bc_rep;

// Runs one repetition (launched: all of them, in this job's rank): forks
// the ranks, records their times in p->rp_res. False with p->rp_err set.
bool bc_run_rep(bc_rep *p);

// ---- output (bench_collective_out.c) -----------------------------------

// Prints cell @idx (@c) once its last repetition reported: a JSON line or
// a table row (the header before the first).
void bc_print_row(const bc_opts *o, bc_results *res, const bc_cell *c,
                  size_t idx);
bool bc_plot(const bc_opts *o, const bc_results *res, const bc_cell *cells,
             size_t ncells);

#endif
