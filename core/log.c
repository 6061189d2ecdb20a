// SPDX-License-Identifier: Apache-2.0
// log.c - leveled logging to a replaceable sink; silent by default.

#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "alloc.h"
#include "config.h"

_Atomic int tp__log_level_v = TP_LOG_OFF;

static tp_log_fn log_fn;
static void *log_arg;
static pthread_once_t log_once = PTHREAD_ONCE_INIT;

static const char *const log_names[] = {"off",  "error", "warn",
                                        "info", "debug", "trace"};

const char *
tp_log_level_name(tp_log_level level)
{
    if ((int)level < 0 || (size_t)level >= TP_ARRAY_LEN(log_names)) {
        return "?";
    }
    return log_names[level];
}

// TP_LOG_LEVEL is parsed by the tunables table (core/config.c), the one
// place every TP_* variable is checked.
static void
log_read_env(void)
{
    const char *s = getenv("TP_LOG_LEVEL");
    if (s == NULL || *s == '\0') {
        return;
    }
    tp_config cfg;
    tp__config_defaults(&cfg);
    tp_error *err = NULL;
    if (tp__config_set(&cfg, "TP_LOG_LEVEL", s, &err) != TP_OK) {
        fprintf(stderr, "tpipe: %s; logging stays off\n",
                tp_error_message(err));
        tp_error_unref(err);
        return;
    }
    atomic_store_explicit(&tp__log_level_v, (int)cfg.log_level,
                          memory_order_relaxed);
}

void
tp__log_init(void)
{
    pthread_once(&log_once, log_read_env);
}

// Runs before main in programs linked with the shared library or objects,
// so TP_LOG_LEVEL takes effect without any call. (Not a registration
// mechanism: nothing is lost if a static link drops it, since every
// context creation calls tp__log_init too.)
__attribute__((constructor)) static void
log_ctor(void)
{
    tp__log_init();
}

void
tp_log_set_handler(tp_log_fn fn, void *arg)
{
    log_fn = fn;
    log_arg = arg;
}

void
tp_log_set_level(tp_log_level level)
{
    tp__log_init();
    atomic_store_explicit(&tp__log_level_v, (int)level, memory_order_relaxed);
}

tp_log_level
tp_log_get_level(void)
{
    return (tp_log_level)atomic_load_explicit(&tp__log_level_v,
                                              memory_order_relaxed);
}

void
tp__log_emit(tp_log_level level, const char *id, const char *fmt, ...)
{
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (log_fn != NULL) {
        log_fn(level, id, buf, log_arg);
        return;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    fprintf(stderr, "tpipe %02d:%02d:%02d.%06ld %-5s %s %s\n", tm.tm_hour,
            tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000, tp_log_level_name(level),
            id, buf);
}
