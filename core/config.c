// SPDX-License-Identifier: Apache-2.0
// config.c - core's own tunables, and loading every component's table
// (core/tunables.h) into a tp_config (STYLE.md §10).
//
// Each table row names a tunable, its environment variable, its default
// (as text, parsed by the same parser as the environment, so the default
// cannot disagree with the checks), doc line, type, bounds and the field
// it fills. The environment is read again at every load, never cached, so
// tests and long-running processes see setenv() changes.

#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "log.h"
#include "pool.h"

static const char *const config_log_levels[] = {
    "off", "error", "warn", "info", "debug", "trace", NULL,
};
static const char *const config_io_backends[] = {"auto", "epoll", "uring",
                                                 NULL};

// The enum values of tp_log_level and tp_io_backend are the indexes above.
_Static_assert(TP_LOG_LEVEL_TRACE == 5, "config_log_levels out of date");
_Static_assert(TP_IO_BACKEND_URING == 2, "config_io_backends out of date");

static const tp_tunable config_core_rows[] = {
    {
        .tu_name = "log_level",
        .tu_env = "TP_LOG_LEVEL",
        .tu_def = "off",
        .tu_doc = "log messages up to this level "
                  "(off|error|warn|info|debug|trace or 0..5)",
        .tu_type = TP_TUNABLE_ENUM,
        TP_TUNABLE_CONFIG_FIELD(log_level),
        .tu_min = 0,
        .tu_max = 5,
        .tu_flags = TP_TUNABLE_NUMERIC,
        .tu_choices = config_log_levels,
    },
    {
        .tu_name = "io_backend",
        .tu_env = "TP_IO_BACKEND",
        .tu_def = "auto",
        .tu_doc = "loop backend: auto tries io_uring, then falls back to "
                  "epoll (auto|epoll|uring)",
        .tu_type = TP_TUNABLE_ENUM,
        TP_TUNABLE_CONFIG_FIELD(io_backend),
        .tu_min = 0,
        .tu_max = 2,
        .tu_choices = config_io_backends,
    },
    {
        .tu_name = "loop_spin_us",
        .tu_env = "TP_LOOP_SPIN_US",
        .tu_def = "50",
        .tu_doc = "microseconds a loop keeps polling its fds after the last "
                  "event before sleeping (0: sleep at once)",
        .tu_type = TP_TUNABLE_INT,
        TP_TUNABLE_CONFIG_FIELD(loop_spin_us),
        .tu_min = 0,
        .tu_max = 1000000,
        .tu_unit = "microseconds",
    },
    {
        .tu_name = "pool_threads",
        .tu_env = "TP_POOL_THREADS",
        .tu_def = "4",
        .tu_doc = "threads of the worker pool",
        .tu_type = TP_TUNABLE_INT,
        TP_TUNABLE_CONFIG_FIELD(pool_threads),
        .tu_min = 1,
        .tu_max = TP_POOL_MAX_THREADS,
        .tu_unit = "threads",
    },
};

const tp_tunables tp__core_tunables = {
    .ts_component = "core",
    .ts_rows = config_core_rows,
    .ts_nrows = TP_ARRAY_LEN(config_core_rows),
    .ts_store = TP_TUNABLES_IN_CONFIG,
};

// Offset of @ts's struct in cfg_own: the OWN tables before it, each at a
// max_align_t boundary, in the order of tp__tunables_at.
static size_t
config_own_offset(const tp_tunables *ts)
{
    size_t off = 0;
    const tp_tunables *t;
    for (size_t i = 0; (t = tp__tunables_at(i)) != NULL; i++) {
        if (t->ts_store != TP_TUNABLES_OWN) {
            continue;
        }
        if (t == ts) {
            // A table too large for cfg_own: raise TP_CONFIG_OWN_BYTES.
            TP_ASSERT(off + ts->ts_size <= TP_CONFIG_OWN_BYTES);
            return off;
        }
        off += (t->ts_size + _Alignof(max_align_t) - 1) &
               ~(_Alignof(max_align_t) - 1);
    }
    TP_ASSERT(!"tunables table not in tp__tunables_at");
    return 0;
}

void *
tp__config_own(tp_config *cfg, const tp_tunables *ts)
{
    TP_ASSERT(ts->ts_store == TP_TUNABLES_OWN);
    return cfg->cfg_own + config_own_offset(ts);
}

const void *
tp__config_own_const(const tp_config *cfg, const tp_tunables *ts)
{
    TP_ASSERT(ts->ts_store == TP_TUNABLES_OWN);
    return cfg->cfg_own + config_own_offset(ts);
}

// Where the rows of @ts store their values in @cfg.
static void *
config_base(tp_config *cfg, const tp_tunables *ts)
{
    return ts->ts_store == TP_TUNABLES_OWN ? tp__config_own(cfg, ts)
                                           : (void *)cfg;
}

static bool
config_is_external(const tp_tunable *e)
{
    return (e->tu_flags & TP_TUNABLE_EXTERNAL) != 0;
}

void
tp__config_defaults(tp_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    const tp_tunables *ts;
    for (size_t i = 0; (ts = tp__tunables_at(i)) != NULL; i++) {
        void *base = config_base(cfg, ts);
        for (size_t j = 0; j < ts->ts_nrows; j++) {
            const tp_tunable *e = &ts->ts_rows[j];
            if (config_is_external(e)) {
                continue;
            }
            // A default the parser rejects is a bug in that table.
            tp_status st =
                tp__tunable_apply(e, base, e->tu_env, e->tu_def, NULL);
            TP_ASSERT(st == TP_OK);
        }
    }
}

typedef void (*config_visit_row_fn)(const tp_tunables *ts, const tp_tunable *e,
                                    const void *base, const char *env_value,
                                    bool ok, void *arg);

// Applies every TP_* variable that is set. Calls @visit (if not NULL) for
// each row, external ones included, with the raw environment value (NULL
// if unset) and whether it was accepted. Returns the first error; later
// ones are logged.
static tp_status
config_load_env(tp_config *cfg, config_visit_row_fn visit, void *arg,
                tp_error **err_p)
{
    tp_status ret = TP_OK;

    tp__config_defaults(cfg);
    const tp_tunables *ts;
    for (size_t i = 0; (ts = tp__tunables_at(i)) != NULL; i++) {
        void *base = config_base(cfg, ts);
        for (size_t j = 0; j < ts->ts_nrows; j++) {
            const tp_tunable *e = &ts->ts_rows[j];
            const char *env_value = getenv(e->tu_env);
            bool ok = true;
            if (env_value != NULL && !config_is_external(e)) {
                tp_error *err = NULL;
                if (tp__tunable_apply(e, base, e->tu_env, env_value, &err) !=
                    TP_OK) {
                    ok = false;
                    if (ret == TP_OK) {
                        ret = TP_EINVAL;
                        if (err_p != NULL) {
                            *err_p = tp_error_ref(err);
                        }
                    } else {
                        // Only the first error is returned; the caller
                        // would otherwise never hear of the others.
                        TP_LOG_WARN("TP-CONFIG-ENV", "%s",
                                    tp_error_message(err));
                    }
                    tp_error_unref(err);
                }
            }
            if (visit != NULL) {
                visit(ts, e, base, env_value, ok, arg);
            }
        }
    }
    return ret;
}

tp_status
tp__config_load(tp_config *cfg, tp_error **err_p)
{
    return config_load_env(cfg, NULL, NULL, err_p);
}

tp_status
tp__config_set(tp_config *cfg, const char *name, const char *value,
               tp_error **err_p)
{
    const tp_tunables *ts;
    for (size_t i = 0; (ts = tp__tunables_at(i)) != NULL; i++) {
        for (size_t j = 0; j < ts->ts_nrows; j++) {
            const tp_tunable *e = &ts->ts_rows[j];
            if (strcmp(name, e->tu_name) != 0 && strcmp(name, e->tu_env) != 0) {
                continue;
            }
            if (config_is_external(e)) {
                return tp__error_set(err_p, TP_EINVAL,
                                     "config tunable %s is read by %s "
                                     "itself, not kept in tp_config",
                                     name, ts->ts_component);
            }
            return tp__tunable_apply(e, config_base(cfg, ts), name, value,
                                     err_p);
        }
    }
    return tp__error_set(err_p, TP_EINVAL, "unknown config tunable %s", name);
}

const char *
tp__io_backend_name(int64_t b)
{
    if (b < 0 || b > TP_IO_BACKEND_URING) {
        return "unknown";
    }
    return config_io_backends[b];
}

typedef struct config_visit_ctx {
    tp_config_visit_fn vc_fn;
    void *vc_arg;
} config_visit_ctx;

static void
config_visit_row(const tp_tunables *ts, const tp_tunable *e, const void *base,
                 const char *env_value, bool ok, void *arg)
{
    config_visit_ctx *vc = arg;
    // Large enough for the longest string field plus the note below.
    char value[sizeof(((tp_config *)NULL)->socket_addr) + 64];
    char accepted[256];

    if ((e->tu_flags & TP_TUNABLE_SECRET) != 0 && env_value != NULL) {
        snprintf(value, sizeof(value), "(set, not shown)");
    } else if (config_is_external(e)) {
        // Shown as set; its component checks it when it reads it.
        snprintf(value, sizeof(value), "%s",
                 env_value != NULL ? env_value : e->tu_def);
    } else if (ok) {
        tp__tunable_format(e, base, value, sizeof(value));
    } else {
        char def[sizeof(((tp_config *)NULL)->socket_addr)];
        tp__tunable_format(e, base, def, sizeof(def));
        snprintf(value, sizeof(value), "%s (invalid, using %s)", env_value,
                 def);
    }
    tp__tunable_bounds(e, accepted, sizeof(accepted));
    tp_config_item item = {
        .name = e->tu_name,
        .env = e->tu_env,
        .def = e->tu_def,
        .doc = e->tu_doc,
        .value = value,
        .source = env_value != NULL ? "env" : "default",
        .component = ts->ts_component,
        .accepted = accepted,
    };
    vc->vc_fn(&item, vc->vc_arg);
}

tp_status
tp_config_visit(tp_config_visit_fn fn, void *arg, tp_error **err_p)
{
    config_visit_ctx vc = {.vc_fn = fn, .vc_arg = arg};
    tp_config cfg;

    return config_load_env(&cfg, config_visit_row, &vc, err_p);
}
