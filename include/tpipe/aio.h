/* SPDX-License-Identifier: Apache-2.0 */
/* aio.h - the asynchronous operation object used by transports and
 * channels (modelled on nng's aio). */
#ifndef TPIPE_AIO_H
#define TPIPE_AIO_H

#include <stddef.h>
#include <stdint.h>
#include <tpipe/export.h>
#include <tpipe/error.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tp_aio tp_aio;
typedef void (*tp_aio_cb)(void *arg);

/** tp_iov - one buffer of an operation; lengths are 64-bit. */
typedef struct tp_iov {
    void *iov_base;
    uint64_t iov_len;
} tp_iov;

/**
 * tp_aio_create - a new operation object whose completions call @cb(@arg).
 * Completion: @cb runs exactly once per submitted operation, on the loop
 * thread of the object it was submitted to, never inside the submitting
 * call, with no internal lock held. Errors: TP_ENOMEM.
 */
TP_API tp_status tp_aio_create(tp_aio_cb cb, void *arg, tp_aio **aio_p);
/**
 * tp_aio_destroy - cancel any operation in flight, wait until its callback
 * has run, and free. Operations submitted meanwhile (by the callback)
 * complete at once with TP_ECLOSED. NULL is fine. Must not be called from
 * @aio's own callback.
 */
TP_API void tp_aio_destroy(tp_aio *aio);
/** tp_aio_set_timeout - deadline for the next operations; 0 = none. */
TP_API void tp_aio_set_timeout(tp_aio *aio, int64_t timeout_ms);
/**
 * tp_aio_set_iov - the buffers of the next read or write (borrowed until
 * completion). At most 8. Errors: TP_EINVAL.
 */
TP_API tp_status tp_aio_set_iov(tp_aio *aio, unsigned n, const tp_iov *iov);
/** tp_aio_error - the error of the last completed operation; NULL: success. */
TP_API const tp_error *tp_aio_error(const tp_aio *aio);
/** tp_aio_status - the status of the last completed operation. */
TP_API tp_status tp_aio_status(const tp_aio *aio);
/** tp_aio_count - bytes transferred by the last completed operation. */
TP_API uint64_t tp_aio_count(const tp_aio *aio);
/** tp_aio_get_output - output @i (0 or 1) of the last operation. */
TP_API void *tp_aio_get_output(const tp_aio *aio, int i);
/**
 * tp_aio_cancel - request cancellation; the operation still completes
 * through its callback (with TP_ECANCELED unless it finished first).
 * Any thread.
 */
TP_API void tp_aio_cancel(tp_aio *aio);
/**
 * tp_aio_wait - block until the operation in flight has completed and its
 * callback has returned. Not from a loop thread.
 */
TP_API void tp_aio_wait(tp_aio *aio);

#ifdef __cplusplus
}
#endif
#endif
