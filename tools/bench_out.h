/* SPDX-License-Identifier: Apache-2.0 */
/* bench_out.h - the rows of every `tpipe bench` command: a table of
 * fixed-width columns (so that each row is printed as soon as its last
 * repetition completed) or one JSON object per line. */
#ifndef TP_TOOLS_BENCH_OUT_H
#define TP_TOOLS_BENCH_OUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum bench_col_kind {
    BENCH_COL_STR,  // v_str; NULL: "-" in the table, null in JSON
    BENCH_COL_U64,  // v_u64
    BENCH_COL_NUM,  // v_num with col_prec decimals (NAN: "-", null)
    BENCH_COL_SIZE, // v_u64 bytes: 64K in the table ("-" for 0), 65536 in JSON
} bench_col_kind;

// A column: its table header and width (negative: left-aligned; 0: JSON
// only), and its JSON key (NULL: table only).
typedef struct bench_col {
    const char *col_head;
    int col_width;
    const char *col_key;
    bench_col_kind col_kind;
    int col_prec; // BENCH_COL_NUM: decimals; -1: the value's v_prec
} bench_col;

typedef struct bench_val {
    const char *v_str;
    uint64_t v_u64;
    double v_num;
    int v_prec;
} bench_val;

typedef struct bench_out {
    const char *out_bench; // the JSON lines' "bench"
    const bench_col *out_cols;
    size_t out_ncols;
    bool out_json;
    bool out_started; // the table's header was printed
} bench_out;

void bench_out_init(bench_out *t, const char *bench, const bench_col *cols,
                    size_t ncols, bool json);
// Prints one row (@vals: one per column), the table's header before the
// first, and flushes stdout.
void bench_out_row(bench_out *t, const bench_val *vals);

// The columns of a latency and bandwidth measurement (bench transport and
// pipe): size, p50_us, p90_us, p99_us, GB/s.
#define BENCH_OUT_STATS_COLS                                                   \
    {"size", 5, "size", BENCH_COL_SIZE, 0},                                    \
        {"p50_us", 10, "p50_us", BENCH_COL_NUM, 2},                            \
        {"p90_us", 10, "p90_us", BENCH_COL_NUM, 2},                            \
        {"p99_us", 10, "p99_us", BENCH_COL_NUM, 2},                            \
    {                                                                          \
        "GB/s", 8, "gbps", BENCH_COL_NUM, 3                                    \
    }

#endif
