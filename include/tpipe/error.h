/* SPDX-License-Identifier: Apache-2.0 */
/* error.h - status codes, refcounted error objects, and tp_free. */
#ifndef TPIPE_ERROR_H
#define TPIPE_ERROR_H

#include <tpipe/export.h>

#ifdef __cplusplus
extern "C" {
#endif

/**
 * tp_status - result of a call; negative on failure.
 *
 * Codes are grouped by what the failure breaks: operation scope (only this
 * call failed), connection scope (the connection or pipe is dead and every
 * operation pending on it fails too), context scope (tear the context down).
 */
typedef enum tp_status {
    TP_OK = 0,
    /* Operation scope: only this call failed. */
    TP_EINVAL = -1,
    TP_ENOMEM = -2,
    TP_ETIMEDOUT = -3,
    TP_ECANCELED = -4,
    TP_ENOTSUP = -5,
    TP_EAGAIN = -6,
    TP_EADDRINUSE = -7,
    TP_EPERM = -8,
    TP_EIO = -9,
    TP_ENOENT = -10,
    /* Connection scope: the connection or pipe is dead. */
    TP_ECONNREFUSED = -20,
    TP_ECONNRESET = -21,
    TP_ECLOSED = -22,
    TP_EPROTO = -23,
    TP_EREMOTE = -24,
    TP_EUNREACHABLE = -25,
    /* Context scope: tear the context down. */
    TP_EINTERNAL = -40,
    TP_EDEVICE = -41,
} tp_status;

/**
 * TP_TIMEOUT_DEFAULT - as a timeout_ms: use the object's default timeout
 * (the store's, the agent's rpc_timeout_ms). 0 means no limit.
 */
#define TP_TIMEOUT_DEFAULT (-1)

/** TP_STATUS_IS_CONN - true if @s means the connection is dead. */
#define TP_STATUS_IS_CONN(s) ((s) <= -20 && (s) > -40)

/**
 * tp_free - free memory the library returned to the caller: strings such
 *   as tp_context_report, tp_pipe_report, tp_rpc_get_debug_info and
 *   tp_pg_get_debug_info, and the values of store gets. It uses the
 *   library's own allocator, so it is right even when the program and the
 *   library were linked against different C runtimes. NULL is a no-op.
 * Thread safety: any thread.
 */
TP_API void tp_free(void *p);

/**
 * tp_error - an immutable, reference-counted error: a status, an optional
 * errno, a human-readable message naming what failed, where and why, and an
 * optional cause. Errors handed to callbacks are borrowed for the duration
 * of the callback; call tp_error_ref() to keep one.
 */
typedef struct tp_error tp_error;

/** tp_error_status - the status code of @err (TP_OK for NULL). */
TP_API tp_status tp_error_status(const tp_error *err);
/** tp_error_errno - the OS errno behind @err, 0 if none. */
TP_API int tp_error_errno(const tp_error *err);
/**
 * tp_error_message - the full message of @err, including the messages of
 * its causes ("rpc echo: tcp: connect to 127.0.0.1:9: connection refused").
 * Never NULL; "success" for NULL. Valid while @err is referenced.
 */
TP_API const char *tp_error_message(const tp_error *err);
/** tp_error_cause - the error that caused @err, or NULL. Borrowed. */
TP_API const tp_error *tp_error_cause(const tp_error *err);
/** tp_error_ref - take a reference; returns @err. NULL is fine. */
TP_API tp_error *tp_error_ref(const tp_error *err);
/** tp_error_unref - drop a reference; NULL is fine. Never blocks. */
TP_API void tp_error_unref(tp_error *err);
/**
 * tp_error_create - a new error (refcount 1) with status @st and the
 * printf-style message @fmt; @cause (may be NULL) is referenced and its
 * message appended after ": ". Never NULL: on out-of-memory it returns a
 * static TP_ENOMEM error (refcounting it is a no-op). For handlers and
 * futures of user code (rpc.h).
 */
TP_API tp_error *tp_error_create(tp_status st, const tp_error *cause,
                                 const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/** tp_status_name - "TP_ECONNRESET" etc.; a static string, never NULL. */
TP_API const char *tp_status_name(tp_status s);
/** tp_status_describe - a short lowercase description of @s. */
TP_API const char *tp_status_describe(tp_status s);

#ifdef __cplusplus
}
#endif
#endif
