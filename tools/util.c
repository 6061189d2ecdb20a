// SPDX-License-Identifier: Apache-2.0
// util.c - argument parsing, JSON output and aligned tables for the tpipe
// command.

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "tool.h"

void
tool_err(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("tpipe: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

bool
tool_parse_u64(const char *s, uint64_t *v_p)
{
    if (s == NULL || *s < '0' || *s > '9') {
        return false;
    }
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0') {
        return false;
    }
    *v_p = v;
    return true;
}

bool
tool_parse_double(const char *s, double *v_p)
{
    if (s == NULL || *s == '\0' || *s == '-') {
        return false;
    }
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno != 0 || *end != '\0' || !isfinite(v) || v < 0) {
        return false;
    }
    *v_p = v;
    return true;
}

bool
tool_parse_size(const char *s, uint64_t *v_p)
{
    if (s == NULL || *s < '0' || *s > '9') {
        return false;
    }
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0) {
        return false;
    }
    unsigned shift = 0;
    switch (*end) {
    case '\0':
        break;
    case 'k':
    case 'K':
        shift = 10;
        end++;
        break;
    case 'm':
    case 'M':
        shift = 20;
        end++;
        break;
    case 'g':
    case 'G':
        shift = 30;
        end++;
        break;
    default:
        return false;
    }
    // Accept "K", "KB", "KiB" alike: all are binary multiples here.
    if (strcmp(end, "iB") == 0 || strcmp(end, "B") == 0) {
        end += strlen(end);
    }
    if (*end != '\0' || (shift > 0 && v > (UINT64_MAX >> shift))) {
        return false;
    }
    *v_p = (uint64_t)v << shift;
    return true;
}

void
tool_format_size(uint64_t v, char *buf, size_t len)
{
    if (v >= (1u << 30) && v % (1u << 30) == 0) {
        snprintf(buf, len, "%lluG", (unsigned long long)(v >> 30));
    } else if (v >= (1u << 20) && v % (1u << 20) == 0) {
        snprintf(buf, len, "%lluM", (unsigned long long)(v >> 20));
    } else if (v >= 1024 && v % 1024 == 0) {
        snprintf(buf, len, "%lluK", (unsigned long long)(v >> 10));
    } else {
        snprintf(buf, len, "%llu", (unsigned long long)v);
    }
}

bool
tool_opt_value(int argc, char **argv, int *i, const char *name,
               const char **value_p, bool *bad_p)
{
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, name, n) != 0) {
        return false;
    }
    if (a[n] == '=') {
        *value_p = a + n + 1;
        return true;
    }
    if (a[n] != '\0') {
        return false;
    }
    if (*i + 1 >= argc) {
        tool_err("option %s needs a value", name);
        *bad_p = true;
        return true;
    }
    *i += 1;
    *value_p = argv[*i];
    return true;
}

void
tool_json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"':
            fputs("\\\"", f);
            break;
        case '\\':
            fputs("\\\\", f);
            break;
        case '\n':
            fputs("\\n", f);
            break;
        case '\t':
            fputs("\\t", f);
            break;
        case '\r':
            fputs("\\r", f);
            break;
        default:
            if (*p < 0x20) {
                fprintf(f, "\\u%04x", *p);
            } else {
                fputc(*p, f);
            }
        }
    }
    fputc('"', f);
}

void
tool_json_num(FILE *f, double v)
{
    if (!isfinite(v)) {
        fputs("null", f);
    } else if (v == floor(v) && fabs(v) < 1e15) {
        fprintf(f, "%.0f", v);
    } else {
        fprintf(f, "%.6g", v);
    }
}

void
tool_table_init(tool_table *t, size_t ncols)
{
    memset(t, 0, sizeof(*t));
    t->tt_ncols = ncols < 16 ? ncols : 16;
}

void
tool_table_add(tool_table *t, const char *const *cells)
{
    if (t->tt_nrows == t->tt_cap) {
        size_t cap = t->tt_cap ? 2 * t->tt_cap : 16;
        char **nc = realloc(t->tt_cells, cap * t->tt_ncols * sizeof(char *));
        if (nc == NULL) {
            return; // out of memory: the row is dropped
        }
        t->tt_cells = nc;
        t->tt_cap = cap;
    }
    for (size_t c = 0; c < t->tt_ncols; c++) {
        const char *s = cells[c] ? cells[c] : "";
        t->tt_cells[t->tt_nrows * t->tt_ncols + c] = strdup(s);
    }
    t->tt_nrows++;
}

void
tool_table_print(const tool_table *t, FILE *f)
{
    size_t w[16] = {0};
    for (size_t r = 0; r < t->tt_nrows; r++) {
        for (size_t c = 0; c < t->tt_ncols; c++) {
            const char *s = t->tt_cells[r * t->tt_ncols + c];
            size_t n = s ? strlen(s) : 0;
            w[c] = n > w[c] ? n : w[c];
        }
    }
    for (size_t r = 0; r < t->tt_nrows; r++) {
        for (size_t c = 0; c < t->tt_ncols; c++) {
            const char *s = t->tt_cells[r * t->tt_ncols + c];
            s = s ? s : "";
            bool last = c + 1 == t->tt_ncols;
            if (t->tt_right[c]) {
                fprintf(f, "%*s", (int)w[c], s);
            } else if (last) {
                fputs(s, f); // no trailing blanks
            } else {
                fprintf(f, "%-*s", (int)w[c], s);
            }
            if (!last) {
                fputs("  ", f);
            }
        }
        fputc('\n', f);
    }
}

void
tool_table_fini(tool_table *t)
{
    for (size_t i = 0; i < t->tt_nrows * t->tt_ncols; i++) {
        free(t->tt_cells[i]);
    }
    free(t->tt_cells);
    memset(t, 0, sizeof(*t));
}

uint64_t
tool_cpu_ns(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ((uint64_t)ru.ru_utime.tv_sec + (uint64_t)ru.ru_stime.tv_sec) *
               1000000000u +
           ((uint64_t)ru.ru_utime.tv_usec + (uint64_t)ru.ru_stime.tv_usec) *
               1000u;
}
