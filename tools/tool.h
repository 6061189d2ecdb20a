/* SPDX-License-Identifier: Apache-2.0 */
/* tool.h - shared helpers of the tpipe command: subcommand entry points,
 * argument parsing, JSON string output and aligned tables. */
#ifndef TP_TOOLS_TOOL_H
#define TP_TOOLS_TOOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

// Exit statuses of every subcommand.
#define TOOL_EXIT_OK    0
#define TOOL_EXIT_FAIL  1 // the work failed (a benchmark error, a stall)
#define TOOL_EXIT_USAGE 2 // bad arguments or a malformed TP_* variable

// Subcommands; argv[0] is the subcommand name.
int tool_info_main(int argc, char **argv);
int tool_bench_main(int argc, char **argv);
int tool_bench_transport_main(int argc, char **argv);
int tool_bench_pipe_main(int argc, char **argv);
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

#endif
