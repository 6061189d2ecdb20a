/* SPDX-License-Identifier: Apache-2.0 */
/* log.h (internal) - logging macros. The level is checked before any
 * formatting. Messages are lowercase and say "peer %s". */
#ifndef TP_CORE_LOG_H
#define TP_CORE_LOG_H

#include <stdatomic.h>
#include <tpipe/log.h>

#include "platform.h"

extern _Atomic int tp__log_level_v;

void tp__log_init(void); // reads TP_LOG_LEVEL once
void tp__log_emit(tp_log_level level, const char *id, const char *fmt, ...)
    TP_PRINTF(3, 4);

static inline bool
tp__log_enabled(tp_log_level level)
{
    return atomic_load_explicit(&tp__log_level_v, memory_order_relaxed) >=
           (int)level;
}

#define TP_LOG_AT(level, id, ...)                                              \
    do {                                                                       \
        if (tp__log_enabled(level)) {                                          \
            tp__log_emit(level, id, __VA_ARGS__);                              \
        }                                                                      \
    } while (0)

#define TP_LOG_ERROR(id, ...) TP_LOG_AT(TP_LOG_LEVEL_ERROR, id, __VA_ARGS__)
#define TP_LOG_WARN(id, ...)  TP_LOG_AT(TP_LOG_LEVEL_WARN, id, __VA_ARGS__)
#define TP_LOG_INFO(id, ...)  TP_LOG_AT(TP_LOG_LEVEL_INFO, id, __VA_ARGS__)
#define TP_LOG_DEBUG(id, ...) TP_LOG_AT(TP_LOG_LEVEL_DEBUG, id, __VA_ARGS__)
#define TP_LOG_TRACE(id, ...) TP_LOG_AT(TP_LOG_LEVEL_TRACE, id, __VA_ARGS__)

#endif
