/* SPDX-License-Identifier: Apache-2.0 */
/* bench_common.h - what `tpipe bench transport` and `tpipe bench pipe`
 * share: their common options, the forked server child's plumbing, the
 * stall-bounded wait for a measurement, and the per-cell results and their
 * output. */
#ifndef TP_TOOLS_BENCH_COMMON_H
#define TP_TOOLS_BENCH_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "bench_peer.h"
#include "tool.h"

#define BENCH_MAX_SIZES 32

// The default of --sizes.
#define BENCH_DEFAULT_SIZES "64,4K,64K,1M,16M,64M"

// The options both benchmarks take: --sizes, --test, --iters, --budget,
// --window, --reps, --json, --stall-timeout, -v.
typedef struct bench_cell bench_cell;

typedef struct bench_opts {
    const char *bo_what;    // "bench transport": prefixes error messages
    const char *bo_vprefix; // tool_verbose's prefix of progress lines
    const char *bo_sizes_arg;
    const char *bo_test_arg;
    uint64_t bo_sizes[BENCH_MAX_SIZES];
    size_t bo_nsizes;
    uint64_t bo_max_size;
    bool bo_pingpong;
    bool bo_stream;
    uint64_t bo_iters;
    double bo_budget;
    unsigned bo_window;
    unsigned bo_reps;
    uint64_t bo_window64, bo_reps64; // as parsed
    bool bo_json;
    double bo_stall_s;
    bool bo_verbose;
    // Called with each cell as its last repetition is recorded (to print
    // its row at once); NULL: not.
    void (*bo_done_fn)(void *arg, bench_cell *cell);
    void *bo_done_arg;
} bench_opts;

// One option of a benchmark's table: --name (or its alias), what it takes
// and where it goes, and its line of the usage. The value is checked
// against [opt_min, opt_max] (numbers, sizes) and the error names the
// option and the range.
typedef enum bench_opt_kind {
    BENCH_OPT_FLAG,   // bool *: set
    BENCH_OPT_STR,    // const char **: the value as given
    BENCH_OPT_U64,    // uint64_t *: an integer
    BENCH_OPT_DOUBLE, // double *: a number
    BENCH_OPT_SIZE,   // uint64_t *: bytes, K/M/G = KiB/MiB/GiB
} bench_opt_kind;

typedef struct bench_opt {
    const char *opt_name;  // "--reps"
    const char *opt_alias; // "-v", or NULL
    bench_opt_kind opt_kind;
    void *opt_target;
    double opt_min, opt_max;
    const char *opt_arg;  // the value in the usage: "N", "LIST"; NULL: none
    const char *opt_help; // the usage's text: '\n' goes on below it
} bench_opt;

// What a command's usage says around its options: the synopsis and what
// it does (before), and notes and the JSON line (after; may be NULL).
typedef struct bench_usage {
    const char *bu_head;
    const char *bu_tail;
} bench_usage;

// Prints the usage: @u's head, a line per option of @opts (name, value,
// help), @u's tail.
void bench_usage_print(FILE *f, const bench_usage *u, const bench_opt *opts,
                       size_t nopts);
// Replaces the help of option @name in @opts (a command's wording of a
// shared option).
void bench_opt_set_help(bench_opt *opts, size_t nopts, const char *name,
                        const char *help);

// If argv[*i] is one of @opts, consumes it (and its value, advancing *i)
// and returns true; a bad value is reported, prefixed with @what, and
// *bad_p set.
bool bench_opt_arg(const char *what, const bench_opt *opts, size_t nopts,
                   int argc, char **argv, int *i, bool *bad_p);
// Parses every argument with @opts: -1 to go on, else the exit status
// (-h: the usage on stdout, TOOL_EXIT_OK; an unknown option or a bad
// value: reported, the usage on stderr, TOOL_EXIT_USAGE).
int bench_parse_args(const char *what, const bench_opt *opts, size_t nopts,
                     const bench_usage *usage, int argc, char **argv);

// Whether @name is one of @valid; if not, reports "<what>: unknown <noun>
// "<name>" (valid: a, b, c)" and returns false.
bool bench_name_check(const char *what, const char *noun, const char *name,
                      const char *const *valid, size_t nvalid);

// Sets the defaults.
void bench_opts_init(bench_opts *o, const char *what, const char *vprefix);
// The common options' entries (BENCH_OPTS_N of them), with their usage
// lines, into @out; a command adds its own to the same table.
#define BENCH_OPTS_N 9
size_t bench_opts_table(bench_opts *o, bench_opt *out);
// After the arguments: resolves --test. False after reporting.
bool bench_opts_test(bench_opts *o);
// Then: checks the TP_* environment (bench_env_check) and parses --sizes
// (setting bo_max_size). False after reporting.
bool bench_opts_finish(bench_opts *o);

// Checks that every TP_* variable of the environment is well formed; false
// after reporting the first bad one (its name and why).
bool bench_env_check(void);

// A rank of a launched job (tpipe run, torchrun, mpirun/srun with RANK and
// WORLD_SIZE exported): where it is in the world and how it meets the
// others.
typedef struct bench_launch {
    bool bl_on;         // launched (the variables are set, or --launched)
    int bl_rank;        // RANK
    int bl_world;       // WORLD_SIZE
    int bl_local_rank;  // LOCAL_RANK, else RANK
    const char *bl_url; // TP_INIT_METHOD, else "env://"
} bench_launch;

// Fills @l from the environment: bl_on when RANK and WORLD_SIZE are both
// set or @forced. A launched run needs RANK in 0..WORLD_SIZE-1 and
// WORLD_SIZE in @min_world..@max_world; false after reporting a missing or
// malformed variable ("<what>: a launched run needs ...").
bool bench_launch_get(const char *what, bool forced, int min_world,
                      int max_world, bench_launch *l);

// The stall timeout in ns.
uint64_t bench_stall_ns(const bench_opts *o);

// Forks the server child, with a pipe(2) for it to report on. In the
// child (return 0) *fd_p is the pipe's write end, and the child is set to
// die with this process. In this process returns the child's pid with the
// read end in *fd_p, or -1 with "pipe: ..." or "fork: ..." in @err.
pid_t bench_fork_server(int *fd_p, char *err, size_t err_len);

// What a server child reports, or how starting it went.
typedef enum bench_outcome {
    BENCH_OK,   // "OK <address>"
    BENCH_SKIP, // "SKIP <why>": the combination cannot work here
    BENCH_FAIL, // "ERR <why>", or no line
} bench_outcome;

// In the server child: reports @rc and @text ("OK <address>", "SKIP
// <why>", "ERR <why>") on @wfd as one line; false when the write failed.
bool bench_server_report(int wfd, bench_outcome rc, const char *text);

// Forks the server child, which runs @child_fn(@arg, its end of the pipe)
// and never returns; then waits (--stall-timeout) for its report. BENCH_OK:
// its address in @addr and its pid in *pid_p (reap it with
// bench_reap_server). Otherwise the child is reaped and @err says why
// ("server: <why>" for its own SKIP or ERR).
bench_outcome bench_server_start(const bench_opts *o,
                                 void (*child_fn)(void *arg, int wfd),
                                 void *arg, char *addr, size_t addr_len,
                                 pid_t *pid_p, char *err, size_t err_len);

// "tpipe: <what>: skipping <label>: <why...>" on stderr, after flushing the
// rows printed so far.
void bench_skip(const char *what, const char *label, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
// Whether the transport or channel @name is viable here; if not, says
// "skipping <label>: <transport|channel> <name>: <why>" (bench_skip).
bool bench_viable(const char *what, const char *label, tool_backend_kind kind,
                  const char *name);

// The @kind backends compiled in, best first (tpipe/info.h): stores at
// most @cap names (static strings) in @names and returns how many. With
// @viable_only, one that cannot work here is left out with a skip message
// ("skipping <transport|channel> <name>: <why>"). A bench's "all".
size_t bench_backends(const char *what, tool_backend_kind kind,
                      bool viable_only, const char **names, size_t cap);

// Reaps the server child @pid (at once, killing it, unless @ok). Returns
// whether @ok and the server exited with status 0; when @ok but the server
// failed, writes how to @err.
bool bench_reap_server(pid_t pid, bool ok, char *err, size_t err_len);

// Waits for the measurement on @s; on failure writes "<what>[, size S
// (N bytes)]: <why>" to @err (the size part when @size is not 0).
bool bench_wait(bt_sync *s, const bench_opts *o, const char *what,
                uint64_t size, char *err, size_t err_len);

// One measurement's results over the repetitions.
typedef struct bench_cell {
    uint64_t bc_size;
    bool bc_stream;  // else pingpong
    size_t bc_index; // in the cells of bench_cells_reset
    double *bc_p50, *bc_p90, *bc_p99, *bc_gbps;
    uint64_t bc_iters; // summed over repetitions
    unsigned bc_n;
} bench_cell;

// Clears the 2 * o->bo_nsizes cells [test][size] (test 0 pingpong, 1
// stream) and points them at @vals (4 * reps values each).
void bench_cells_reset(const bench_opts *o, bench_cell *cells, double *vals);
// Records a ping-pong of @n round trips (@lat, in us; sorted here) as the
// cell's next repetition, with a progress line about @label.
void bench_cell_pingpong(const bench_opts *o, const char *label, uint64_t size,
                         double *lat, size_t n, bench_cell *cell);
// Measures a stream of messages of @size (@bytes on the wire) with
// tool_stream_measure(@run, @arg) and records it as the cell's next
// repetition, with a progress line about @label. False when @run failed.
bool bench_stream(const bench_opts *o, const char *label, uint64_t size,
                  double bytes,
                  bool (*run)(void *arg, uint64_t count, double *secs_p),
                  void *arg, bench_cell *cell);

// A cell's medians over its repetitions.
typedef struct bench_medians {
    double bm_p50, bm_p90, bm_p99, bm_gbps;
} bench_medians;

// False when the cell has no repetitions.
bool bench_cell_medians(bench_cell *cell, bench_medians *m);
#endif
