/* SPDX-License-Identifier: Apache-2.0 */
/* log.h - logging sink and level. The library is silent by default. */
#ifndef TPIPE_LOG_H
#define TPIPE_LOG_H

#include <tpipe/export.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tp_log_level {
    TP_LOG_OFF = 0,
    TP_LOG_LEVEL_ERROR = 1,
    TP_LOG_LEVEL_WARN = 2,
    TP_LOG_LEVEL_INFO = 3,
    TP_LOG_LEVEL_DEBUG = 4,
    TP_LOG_LEVEL_TRACE = 5,
} tp_log_level;

/**
 * tp_log_fn - a log sink. @id is a stable message id ("TP-TCP-CONNECT"),
 * @msg the formatted, lowercase message without a trailing newline.
 * Called on whatever thread logs; must not call back into tpipe.
 */
typedef void (*tp_log_fn)(tp_log_level level, const char *id, const char *msg,
                          void *arg);

/**
 * tp_log_set_handler - install @fn as the log sink (NULL restores the
 * default sink, which writes to stderr). Thread safety: call before other
 * threads use the library.
 */
TP_API void tp_log_set_handler(tp_log_fn fn, void *arg);
/**
 * tp_log_set_level - messages above @level are dropped before formatting.
 * The initial level comes from TP_LOG_LEVEL (off|error|warn|info|debug|
 * trace or 0..5); default off. Thread safety: any thread.
 */
TP_API void tp_log_set_level(tp_log_level level);
/** tp_log_get_level - the current level. */
TP_API tp_log_level tp_log_get_level(void);
/** tp_log_level_name - "error", "warn", ... */
TP_API const char *tp_log_level_name(tp_log_level level);

#ifdef __cplusplus
}
#endif
#endif
