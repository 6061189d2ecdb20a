/* SPDX-License-Identifier: Apache-2.0 */
/* error.h (internal) - creating errors where they are first detected. */
#ifndef TP_CORE_ERROR_H
#define TP_CORE_ERROR_H

#include <tpipe/error.h>

#include "platform.h"

// A new error with refcount 1. Never NULL: on OOM returns the static
// TP_ENOMEM error. @cause is borrowed (referenced, and its message appended
// after ": ").
tp_error *tp__error_new(tp_status st, int errnum, const tp_error *cause,
                        const char *fmt, ...) TP_PRINTF(4, 5);

// Sets *err_p (if err_p is not NULL) to a new error and returns @st.
tp_status tp__error_set(tp_error **err_p, tp_status st, const char *fmt, ...)
    TP_PRINTF(3, 4);

// As tp__error_set, with the status mapped from @errnum and
// ": <strerror> (<ERRNAME>)" appended. Returns the mapped status.
tp_status tp__error_errno(tp_error **err_p, int errnum, const char *fmt, ...)
    TP_PRINTF(3, 4);

// Replaces *err_p (if it holds an error) with a new error of the same
// status whose message is "<fmt>: <old message>" and whose cause is the old
// error. Returns that status (or @st if *err_p is NULL or err_p is NULL).
tp_status tp__error_wrap(tp_error **err_p, tp_status st, const char *fmt, ...)
    TP_PRINTF(3, 4);

// The status an errno maps to (ECONNREFUSED -> TP_ECONNREFUSED, ...).
tp_status tp__status_from_errno(int errnum);
// "ECONNRESET" etc., or "E?" for unknown values.
const char *tp__errno_name(int errnum);

// The preallocated out-of-memory error (refcounting is a no-op on it).
tp_error *tp__error_nomem(void);

#endif
