/* SPDX-License-Identifier: Apache-2.0 */
/* tool.h - shared helpers of the tpipe command: subcommand entry points,
 * argument parsing, JSON string output, aligned tables and the benchmarks'
 * statistics and server-child plumbing. */
#ifndef TP_TOOLS_TOOL_H
#define TP_TOOLS_TOOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

// Exit statuses of every subcommand.
#define TOOL_EXIT_OK    0
#define TOOL_EXIT_FAIL  1 // the work failed (a benchmark error, a stall)
#define TOOL_EXIT_USAGE 2 // bad arguments or a malformed TP_* variable

// Subcommands; argv[0] is the subcommand name.
int tool_info_main(int argc, char **argv);
int tool_bench_main(int argc, char **argv);
int tool_bench_transport_main(int argc, char **argv);
int tool_bench_pipe_main(int argc, char **argv);
int tool_bench_rpc_main(int argc, char **argv);
int tool_bench_collective_main(int argc, char **argv);
int tool_store_main(int argc, char **argv); // `tpipe store` (store.c)
int tool_run_main(int argc, char **argv);   // `tpipe run` (run.c)
// `tpipe info --config[=COMPONENT]` (info_config.c).
int tool_info_config(bool json, const char *component);
// `tpipe info --connect URL` / `--listen [URL]` (info_pipe.c).
int tool_info_connect(const char *url, int64_t timeout_ms,
                      const char *transports, const char *channels);
int tool_info_listen(const char *url, int64_t timeout_ms, long count,
                     const char *transports, const char *channels);

// Prints "tpipe: <message>\n" to stderr.
void tool_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// CPU time (user + system) this process has used, in ns.
uint64_t tool_cpu_ns(void);

// Parses "64", "4K", "64KiB", "1M", "2G" (binary multiples) into bytes.
bool tool_parse_size(const char *s, uint64_t *v_p);
// Formats bytes compactly: 64 -> "64", 4096 -> "4K", 1048576 -> "1M".
void tool_format_size(uint64_t v, char *buf, size_t len);
// Parses a non-negative decimal (possibly fractional) number.
bool tool_parse_double(const char *s, double *v_p);
bool tool_parse_u64(const char *s, uint64_t *v_p);

// If argv[*i] is "--name VALUE" or "--name=VALUE", stores VALUE, advances
// *i past it and returns true. A missing VALUE is reported and *bad_p set.
bool tool_opt_value(int argc, char **argv, int *i, const char *name,
                    const char **value_p, bool *bad_p);

// Writes @s as a JSON string literal (quoted, escaped).
void tool_json_str(FILE *f, const char *s);
// Writes a JSON number, or null when @v is not finite.
void tool_json_num(FILE *f, double v);

// An aligned text table: add rows of cells, then print with each column
// padded to its widest cell.
typedef struct tool_table {
    size_t tt_ncols;
    size_t tt_nrows;
    size_t tt_cap;
    char **tt_cells;   // tt_nrows * tt_ncols, owned
    bool tt_right[16]; // right-align this column
} tool_table;

void tool_table_init(tool_table *t, size_t ncols);
void tool_table_add(tool_table *t, const char *const *cells);
void tool_table_print(const tool_table *t, FILE *f);
void tool_table_fini(tool_table *t);

// ---- transports and channels (backends.c, through tpipe/info.h) ----

typedef enum tool_backend_kind {
    TOOL_TRANSPORT,
    TOOL_CHANNEL,      // every channel (TP_CHANNELS)
    TOOL_PIPE_CHANNEL, // those a pipe may take as its channel (not cuda_ipc)
} tool_backend_kind;

// The device channels compiled in, comma-separated ("cuda_ipc"; "" none).
void tool_device_channels(char *buf, size_t len);
// "transport" or "channel".
const char *tool_backend_kind_name(tool_backend_kind kind);
// The names compiled in, best first: "shm, tcp".
void tool_backend_names(tool_backend_kind kind, char *buf, size_t len);
// Whether @name is compiled in.
bool tool_backend_known(tool_backend_kind kind, const char *name);
// Whether @name works here; when not, why in @why ("not built in" for an
// unknown name).
bool tool_backend_viable(tool_backend_kind kind, const char *name, char *why,
                         size_t why_len);
// Reports "<what>: unknown transport "x" (valid: shm, tcp[, @extra])".
void tool_backend_unknown(const char *what, tool_backend_kind kind,
                          const char *name, const char *extra);

// ---- shared by the benchmarks (bench_transport.c, bench_pipe.c) ----

// qsort comparator for doubles, ascending.
int tool_cmp_double(const void *a, const void *b);
// Median of @v (sorts @v); NAN when @n is 0.
double tool_median(double *v, size_t n);
// Nearest-rank quantile @q of @v, which is sorted; NAN when @n is 0.
double tool_quantile(const double *v, size_t n, double q);
// Formats @v with @prec decimals, or "-" when it is not finite.
void tool_fmt_num(char *buf, size_t len, double v, int prec);

// If @on, prints "tpipe: <prefix>: <message>\n" to stderr ("tpipe:
// <message>\n" when @prefix is NULL).
void tool_verbose(bool on, const char *prefix, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

// Results of tool_read_line.
typedef enum tool_line_status {
    TOOL_LINE_OK,      // a line (or @len - 1 bytes) was read
    TOOL_LINE_TIMEOUT, // @deadline_ns passed first
    TOOL_LINE_EOF,     // the writer closed (or read failed) first
    TOOL_LINE_ERROR,   // poll failed; @why says how
} tool_line_status;

// Reads one line from @fd into @buf (NUL-terminated, the newline dropped),
// waiting until @deadline_ns (a tp__now_ns() value). On TOOL_LINE_ERROR
// writes the reason to @why; on TIMEOUT and EOF the caller words it.
tool_line_status tool_read_line(int fd, uint64_t deadline_ns, char *buf,
                                size_t len, char *why, size_t why_len);

// A free loopback port (bound on 127.0.0.1, read back and closed; another
// process may take it in between). -1 with the reason in @err on failure.
int tool_free_port(char *err, size_t err_len);

// Waits for the child @pid; kills it first if @kill_now, or if it does not
// exit within @grace_ms. Returns its wait status (or -1).
int tool_reap(pid_t pid, int grace_ms, bool kill_now);

// Last resort during teardown after a failure: operations that do not
// complete on close must not hang the tool forever. Arms SIGALRM in
// @seconds; it prints "tpipe: <what>: teardown after an error hung;
// exiting\n" and exits with TOOL_EXIT_FAIL. Cancel with alarm(0).
void tool_install_teardown_alarm(const char *what, unsigned seconds);

// Sizes a stream measurement to fill about @budget seconds. @run sends
// @count messages and stores the seconds they took (false on failure). An
// untimed warm-up of 2W messages (@window W) estimates the rate; measured
// runs then have between max(2W, 16) and max(@iters, that) messages, and a
// run far shorter than the budget (the estimate was pessimistic) is
// repeated with a better estimate, twice at most. Stores the last run's
// count and seconds.
bool tool_stream_measure(uint64_t window, uint64_t iters, double budget,
                         bool (*run)(void *arg, uint64_t count, double *secs_p),
                         void *arg, uint64_t *count_p, double *secs_p);

#endif
