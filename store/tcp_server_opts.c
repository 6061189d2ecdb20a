// SPDX-License-Identifier: Apache-2.0
// tcp_server_opts.c - the bounds of the tcp store server: one table of
// {field, environment variable, default, bounds}, applied as options
// field, else environment variable, else default (docs/store.md).
//
// TP_STORE_MAX_VALUE stays in core's table (tp_config), which the client
// reads too; the server-only bounds live here, beside their only user.

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tcp_server_int.h"

#define OPT_GIB    (1024ll * 1024 * 1024)
#define OPT_DAY_MS (24ll * 3600 * 1000)

typedef struct srv_opt {
    const char *so_env;
    size_t so_field; // offset in tp_store_server_options
    int64_t so_def;
    int64_t so_min; // a value in the environment; 0 may also be allowed
    int64_t so_max;
    bool so_size;    // accepts K, M, G suffixes
    bool so_zero_ok; // 0 in the environment: no limit
} srv_opt;

static const srv_opt srv_opts[] = {
    {"TP_STORE_MAX_CONNS", offsetof(tp_store_server_options, max_conns), 1024,
     1, 1 << 20, false, false},
    {"TP_STORE_IDLE_TIMEOUT_MS",
     offsetof(tp_store_server_options, idle_timeout_ms), 300000, 1, OPT_DAY_MS,
     false, true},
    {"TP_STORE_REQUEST_TIMEOUT_MS",
     offsetof(tp_store_server_options, request_timeout_ms), 10000, 1,
     OPT_DAY_MS, false, true},
    {"TP_STORE_MAX_BYTES", offsetof(tp_store_server_options, max_bytes),
     OPT_GIB, 1, 1024 * OPT_GIB, true, false},
};

// Parses a decimal integer with an optional K, M or G (binary) suffix.
static bool
opt_parse(const char *s, bool size, int64_t *v_p)
{
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || end == s || v < 0) {
        return false;
    }
    int64_t mul = 1;
    if (size && *end != '\0') {
        switch (toupper((unsigned char)*end)) {
        case 'K':
            mul = 1024;
            break;
        case 'M':
            mul = 1024 * 1024;
            break;
        case 'G':
            mul = OPT_GIB;
            break;
        default:
            return false;
        }
        end++;
    }
    if (*end != '\0' || v > INT64_MAX / mul) {
        return false;
    }
    *v_p = (int64_t)v * mul;
    return true;
}

tp_status
tp__srv_limits_load(const tp_store_server_options *o, int64_t max_value,
                    srv_limits *l, tp_error **err_p)
{
    tp_store_server_options opts = {0};
    if (o != NULL) {
        if (o->size < offsetof(tp_store_server_options, max_conns) ||
            o->size > sizeof(opts)) {
            return tp__error_set(err_p, TP_EINVAL,
                                 "store server: options size %zu unknown "
                                 "(set it to sizeof(tp_store_server_options))",
                                 o->size);
        }
        memcpy(&opts, o, o->size);
    }
    tp_store_server_options out = {0};
    for (size_t i = 0; i < TP_ARRAY_LEN(srv_opts); i++) {
        const srv_opt *d = &srv_opts[i];
        int64_t v = *(const int64_t *)((const char *)&opts + d->so_field);
        if (v < 0) {
            return tp__error_set(err_p, TP_EINVAL,
                                 "store server: option of %s is negative "
                                 "(%" PRId64 ")",
                                 d->so_env, v);
        }
        if (v == 0) {
            const char *s = getenv(d->so_env);
            v = d->so_def;
            if (s != NULL && *s != '\0') {
                if (!opt_parse(s, d->so_size, &v) ||
                    (v == 0 && !d->so_zero_ok) ||
                    (v != 0 && (v < d->so_min || v > d->so_max))) {
                    return tp__error_set(
                        err_p, TP_EINVAL,
                        "store server: %s=%s: expected %s from %" PRId64
                        " to %" PRId64 "%s",
                        d->so_env, s, d->so_size ? "a size" : "an integer",
                        d->so_min, d->so_max,
                        d->so_zero_ok ? ", or 0 for none" : "");
                }
            }
        }
        *(int64_t *)((char *)&out + d->so_field) = v;
    }
    l->sl_max_conns = out.max_conns;
    l->sl_idle_ms = out.idle_timeout_ms;
    l->sl_request_ms = out.request_timeout_ms;
    l->sl_max_bytes = out.max_bytes;
    l->sl_max_value = opts.max_value > 0 ? opts.max_value : max_value;
    return TP_OK;
}
