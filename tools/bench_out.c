// SPDX-License-Identifier: Apache-2.0
// bench_out.c - the rows of every `tpipe bench` command (bench_out.h).

#include <stdio.h>
#include <stdlib.h>

#include "bench_out.h"
#include "tool.h"

void
bench_out_init(bench_out *t, const char *bench, const bench_col *cols,
               size_t ncols, bool json)
{
    *t = (bench_out){.out_bench = bench,
                     .out_cols = cols,
                     .out_ncols = ncols,
                     .out_json = json};
}

static void
bench_out_cell(const char *s, int width, bool first)
{
    printf("%s%*s", first ? "" : "  ", width, s);
}

void
bench_out_row(bench_out *t, const bench_val *vals)
{
    if (t->out_json) {
        printf("{\"bench\":");
        tool_json_str(stdout, t->out_bench);
        for (size_t k = 0; k < t->out_ncols; k++) {
            const bench_col *c = &t->out_cols[k];
            const bench_val *v = &vals[k];
            if (c->col_key == NULL) {
                continue;
            }
            printf(",\"%s\":", c->col_key);
            switch (c->col_kind) {
            case BENCH_COL_STR:
                if (v->v_str != NULL) {
                    tool_json_str(stdout, v->v_str);
                } else {
                    printf("null");
                }
                break;
            case BENCH_COL_U64:
            case BENCH_COL_SIZE:
                printf("%llu", (unsigned long long)v->v_u64);
                break;
            case BENCH_COL_NUM:
                tool_json_num(stdout, v->v_num);
                break;
            }
        }
        printf("}\n");
        fflush(stdout);
        return;
    }
    if (!t->out_started) {
        t->out_started = true;
        bool first = true;
        for (size_t k = 0; k < t->out_ncols; k++) {
            const bench_col *c = &t->out_cols[k];
            if (c->col_width != 0) {
                bench_out_cell(c->col_head, c->col_width, first);
                first = false;
            }
        }
        printf("\n");
    }
    bool first = true;
    for (size_t k = 0; k < t->out_ncols; k++) {
        const bench_col *c = &t->out_cols[k];
        const bench_val *v = &vals[k];
        char buf[64];
        if (c->col_width == 0) {
            continue;
        }
        switch (c->col_kind) {
        case BENCH_COL_STR:
            snprintf(buf, sizeof(buf), "%s", v->v_str ? v->v_str : "-");
            break;
        case BENCH_COL_U64:
            snprintf(buf, sizeof(buf), "%llu", (unsigned long long)v->v_u64);
            break;
        case BENCH_COL_SIZE:
            if (v->v_u64 == 0) {
                snprintf(buf, sizeof(buf), "-");
            } else {
                tool_format_size(v->v_u64, buf, sizeof(buf));
            }
            break;
        case BENCH_COL_NUM:
            tool_fmt_num(buf, sizeof(buf), v->v_num,
                         c->col_prec >= 0 ? c->col_prec : v->v_prec);
            break;
        }
        bench_out_cell(buf, c->col_width, first);
        first = false;
    }
    printf("\n");
    fflush(stdout);
}
