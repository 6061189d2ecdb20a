// SPDX-License-Identifier: Apache-2.0
// tunables.c - the parser every component's table of tunables shares
// (core/tunables.h): integers, sizes, durations, text and enums, their
// bounds, and the messages naming the variable, the value and what is
// accepted. The tables and the loading into tp_config are core/config.c's.

#include "tunables.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "error.h"

// Renders @v with the largest K, M or G suffix that divides it exactly.
static void
tun_format_size(int64_t v, char *buf, size_t len)
{
    static const char suffixes[] = {'G', 'M', 'K'};
    static const int64_t units[] = {TP_TUNABLE_GIB, TP_TUNABLE_MIB,
                                    TP_TUNABLE_KIB};

    for (size_t i = 0; i < TP_ARRAY_LEN(units); i++) {
        if (v != 0 && v % units[i] == 0) {
            snprintf(buf, len, "%lld%c", (long long)(v / units[i]),
                     suffixes[i]);
            return;
        }
    }
    snprintf(buf, len, "%lld", (long long)v);
}

// Parses a decimal integer at the start of @s into *v_p and points *rest_p
// after it. Rejects leading blanks (strtoll would skip them) and overflow.
static bool
tun_parse_int_prefix(const char *s, int64_t *v_p, const char **rest_p)
{
    const char *digits = (s[0] == '-' || s[0] == '+') ? s + 1 : s;
    if (!isdigit((unsigned char)digits[0])) {
        return false;
    }
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (errno == ERANGE) {
        return false;
    }
    *v_p = v;
    *rest_p = end;
    return true;
}

// Returns true and the scaled value if @s is a size ("4194304", "4M").
static bool
tun_parse_size(const char *s, int64_t *v_p)
{
    int64_t v;
    const char *rest;
    if (!tun_parse_int_prefix(s, &v, &rest) || v < 0) {
        return false;
    }
    int64_t unit = 1;
    switch (rest[0]) {
    case '\0':
        break;
    case 'k':
    case 'K':
        unit = TP_TUNABLE_KIB;
        break;
    case 'm':
    case 'M':
        unit = TP_TUNABLE_MIB;
        break;
    case 'g':
    case 'G':
        unit = TP_TUNABLE_GIB;
        break;
    default:
        return false;
    }
    if (unit != 1 && rest[1] != '\0') {
        return false;
    }
    if (v > INT64_MAX / unit) {
        return false;
    }
    *v_p = v * unit;
    return true;
}

// Returns true and the value in ms if @s is "250", "250ms" or "10s".
static bool
tun_parse_ms(const char *s, int64_t *v_p)
{
    int64_t v;
    const char *rest;
    if (!tun_parse_int_prefix(s, &v, &rest) || v < 0) {
        return false;
    }
    if (rest[0] == '\0' || strcmp(rest, "ms") == 0) {
        *v_p = v;
        return true;
    }
    if (strcmp(rest, "s") == 0 && v <= INT64_MAX / 1000) {
        *v_p = v * 1000;
        return true;
    }
    return false;
}

static bool
tun_parse_enum(const tp_tunable *e, const char *s, int64_t *v_p)
{
    for (int64_t i = 0; e->tu_choices[i] != NULL; i++) {
        if (strcasecmp(s, e->tu_choices[i]) == 0) {
            *v_p = i;
            return true;
        }
    }
    int64_t v;
    const char *rest;
    if ((e->tu_flags & TP_TUNABLE_NUMERIC) != 0 &&
        tun_parse_int_prefix(s, &v, &rest) && rest[0] == '\0' &&
        v >= e->tu_min && v <= e->tu_max) {
        *v_p = v;
        return true;
    }
    return false;
}

static bool
tun_is_pow2(int64_t v)
{
    return v > 0 && (v & (v - 1)) == 0;
}

// Fills @buf with what @e accepts, completing "<ENV>=<value>: ..." in the
// error message of a malformed value.
static void
tun_describe_accepted(const tp_tunable *e, char *buf, size_t len)
{
    char lo[32];
    char hi[32];

    switch (e->tu_type) {
    case TP_TUNABLE_INT:
        snprintf(buf, len, "not an integer between %lld and %lld (%s)",
                 (long long)e->tu_min, (long long)e->tu_max, e->tu_unit);
        break;
    case TP_TUNABLE_SIZE:
        tun_format_size(e->tu_min, lo, sizeof(lo));
        tun_format_size(e->tu_max, hi, sizeof(hi));
        if ((e->tu_flags & TP_TUNABLE_POW2) != 0) {
            snprintf(buf, len, "not a power of two between %s and %s", lo, hi);
        } else {
            snprintf(buf, len,
                     "not a size between %s and %s (bytes, or with a K, M or "
                     "G suffix)",
                     lo, hi);
        }
        break;
    case TP_TUNABLE_MS:
        snprintf(buf, len,
                 "not a duration between %lld and %lld ms (milliseconds, or "
                 "with an s suffix)",
                 (long long)e->tu_min, (long long)e->tu_max);
        break;
    case TP_TUNABLE_STR:
        snprintf(buf, len, "longer than %zu bytes", e->tu_size - 1);
        break;
    case TP_TUNABLE_ENUM: {
        size_t off = (size_t)snprintf(buf, len, "not one of ");
        for (size_t i = 0; e->tu_choices[i] != NULL && off < len; i++) {
            off += (size_t)snprintf(buf + off, len - off, "%s%s",
                                    i > 0 ? "|" : "", e->tu_choices[i]);
        }
        if ((e->tu_flags & TP_TUNABLE_NUMERIC) != 0 && off < len) {
            snprintf(buf + off, len - off, " or %lld..%lld",
                     (long long)e->tu_min, (long long)e->tu_max);
        }
        break;
    }
    }
}

static int64_t *
tun_int_field(const tp_tunable *e, void *base)
{
    TP_ASSERT(e->tu_size == sizeof(int64_t));
    return (int64_t *)(void *)((char *)base + e->tu_offset);
}

static const int64_t *
tun_int_field_const(const tp_tunable *e, const void *base)
{
    TP_ASSERT(e->tu_size == sizeof(int64_t));
    return (const int64_t *)(const void *)((const char *)base + e->tu_offset);
}

tp_status
tp__tunable_apply(const tp_tunable *e, void *base, const char *label,
                  const char *value, tp_error **err_p)
{
    TP_ASSERT((e->tu_flags & TP_TUNABLE_EXTERNAL) == 0);
    int64_t v = 0;
    bool ok = false;

    switch (e->tu_type) {
    case TP_TUNABLE_INT: {
        const char *rest;
        ok = tun_parse_int_prefix(value, &v, &rest) && rest[0] == '\0';
        break;
    }
    case TP_TUNABLE_SIZE:
        ok = tun_parse_size(value, &v);
        if (ok && (e->tu_flags & TP_TUNABLE_POW2) != 0) {
            ok = tun_is_pow2(v);
        }
        break;
    case TP_TUNABLE_MS:
        ok = tun_parse_ms(value, &v);
        break;
    case TP_TUNABLE_ENUM:
        ok = tun_parse_enum(e, value, &v);
        break;
    case TP_TUNABLE_STR:
        if (strlen(value) >= e->tu_size) {
            break;
        }
        char *dst = (char *)base + e->tu_offset;
        memset(dst, 0, e->tu_size);
        memcpy(dst, value, strlen(value));
        return TP_OK;
    }
    if (ok && (v < e->tu_min || v > e->tu_max)) {
        ok = false;
    }
    if (!ok) {
        char accepted[160];
        tun_describe_accepted(e, accepted, sizeof(accepted));
        return tp__error_set(err_p, TP_EINVAL, "%s=%s: %s", label, value,
                             accepted);
    }
    *tun_int_field(e, base) = v;
    return TP_OK;
}

void
tp__tunable_format(const tp_tunable *e, const void *base, char *buf, size_t len)
{
    if (e->tu_type == TP_TUNABLE_STR) {
        snprintf(buf, len, "%s", (const char *)base + e->tu_offset);
        return;
    }
    int64_t v = *tun_int_field_const(e, base);
    switch (e->tu_type) {
    case TP_TUNABLE_SIZE:
        tun_format_size(v, buf, len);
        break;
    case TP_TUNABLE_ENUM:
        TP_ASSERT(v >= e->tu_min && v <= e->tu_max);
        snprintf(buf, len, "%s", e->tu_choices[v]);
        break;
    default:
        snprintf(buf, len, "%lld", (long long)v);
        break;
    }
}

void
tp__tunable_bounds(const tp_tunable *e, char *buf, size_t len)
{
    char lo[32];
    char hi[32];

    if ((e->tu_flags & TP_TUNABLE_EXTERNAL) != 0) {
        snprintf(buf, len, "%s", e->tu_accepted != NULL ? e->tu_accepted : "");
        return;
    }
    switch (e->tu_type) {
    case TP_TUNABLE_INT:
        snprintf(buf, len, "%lld..%lld%s%s", (long long)e->tu_min,
                 (long long)e->tu_max, e->tu_unit != NULL ? " " : "",
                 e->tu_unit != NULL ? e->tu_unit : "");
        break;
    case TP_TUNABLE_SIZE:
        tun_format_size(e->tu_min, lo, sizeof(lo));
        tun_format_size(e->tu_max, hi, sizeof(hi));
        snprintf(buf, len, "%s..%s bytes%s", lo, hi,
                 (e->tu_flags & TP_TUNABLE_POW2) != 0 ? ", a power of two"
                                                      : "");
        break;
    case TP_TUNABLE_MS:
        snprintf(buf, len, "%lld..%lld ms", (long long)e->tu_min,
                 (long long)e->tu_max);
        break;
    case TP_TUNABLE_STR:
        snprintf(buf, len, "text, up to %zu bytes", e->tu_size - 1);
        break;
    case TP_TUNABLE_ENUM: {
        size_t off = 0;
        buf[0] = '\0';
        for (size_t i = 0; e->tu_choices[i] != NULL && off < len; i++) {
            off += (size_t)snprintf(buf + off, len - off, "%s%s",
                                    i > 0 ? "|" : "", e->tu_choices[i]);
        }
        if ((e->tu_flags & TP_TUNABLE_NUMERIC) != 0 && off < len) {
            snprintf(buf + off, len - off, " or %lld..%lld",
                     (long long)e->tu_min, (long long)e->tu_max);
        }
        break;
    }
    }
}
