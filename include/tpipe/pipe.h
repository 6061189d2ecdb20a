/* SPDX-License-Identifier: Apache-2.0 */
/* pipe.h - contexts, listeners and pipes: connections between two
 * endpoints that negotiate the best transport and channel and move
 * messages (metadata + payloads + tensors).
 *
 * A context registers the transports and channels compiled in and usable
 * here (filtered by the allow/deny lists of its options), owns one loop
 * thread, and creates listeners and pipes. Operations take a tp_aio
 * (aio.h): the aio's callback runs once per operation, on the context's
 * loop thread, and must not block; tp_aio_wait waits for it from another
 * thread. Every operation honours the aio's timeout (tp_aio_set_timeout).
 *
 * Ordering: writes complete in the order submitted, reads too. An error
 * on a pipe (peer died, protocol error, a timed-out or canceled operation
 * that had started moving bytes, tp_pipe_close) fails every pending
 * operation of that pipe, in order, with that error; other pipes of the
 * context are untouched.
 */
#ifndef TPIPE_PIPE_H
#define TPIPE_PIPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <tpipe/aio.h>
#include <tpipe/error.h>
#include <tpipe/export.h>
#include <tpipe/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tp_context tp_context;
typedef struct tp_pipe_listener tp_pipe_listener;
typedef struct tp_pipe tp_pipe;

/** tp_msg_buf - one payload or tensor of a message. */
typedef struct tp_msg_buf {
    void *data;       /* write: source; read: destination, or NULL */
    uint64_t len;     /* bytes */
    tp_device device; /* TP_DEVICE_CPU (CUDA channels: later) */
    bool pipe_owned;  /* set by the pipe: data was allocated by it */
} tp_msg_buf;

/**
 * tp_message - what a pipe moves. Payloads always travel on the pipe's
 * connection; tensors travel on the negotiated channel (basic, xth, cma,
 * mpt). Lengths are 64-bit.
 */
typedef struct tp_message {
    void *metadata;
    uint64_t metadata_len;
    tp_msg_buf *payloads;
    uint32_t npayloads;
    tp_msg_buf *tensors;
    uint32_t ntensors;
} tp_message;

/**
 * tp_message_create - a message with @npayloads and @ntensors zeroed
 * buffers and no metadata; freed with tp_message_destroy.
 */
TP_API tp_status tp_message_create(uint32_t npayloads, uint32_t ntensors,
                                   tp_message **msg_p);
/**
 * tp_message_destroy - frees a message made by tp_message_create or by
 * tp_pipe_read_descriptor, its metadata if the pipe allocated it, and
 * every buffer marked pipe_owned. Buffers the caller supplied are not
 * freed. NULL is a no-op.
 */
TP_API void tp_message_destroy(tp_message *msg);

/**
 * tp_context_options - initialise with tp_context_options_init, then
 * change fields. @size (set by the init function to
 * sizeof(tp_context_options)) lets the struct grow: a library newer than
 * the caller gives the fields past @size their defaults; a size it does
 * not know (a caller built against another version, or a struct not
 * initialised) makes tp_context_create fail with TP_EINVAL.
 */
typedef struct tp_context_options {
    size_t size;
    /* shown in the peer's errors and reports; NULL = "tpipe-<pid>" */
    const char *name;
    /* comma-separated allow lists of transport / channel names; NULL or
     * "" = every registered one. An unknown name is an error that lists
     * the known ones (like PyTorch's _transports / _channels). */
    const char *transports;
    const char *channels;
    /* comma-separated deny lists, applied after the allow lists */
    const char *deny_transports;
    const char *deny_channels;
    /* lanes of the mpt channel; 0 = TP_MPT_LANES */
    int mpt_lanes;
} tp_context_options;

/** tp_context_options_init - defaults (every field 0 / NULL), and @size. */
TP_API void tp_context_options_init(tp_context_options *o);

/**
 * tp_context_create - starts the loop thread and sets up every allowed
 * transport and channel that works here (those that do not are listed in
 * tp_context_report with the reason).
 */
TP_API tp_status tp_context_create(const tp_context_options *o,
                                   tp_context **ctx_p, tp_error **err_p);
/**
 * tp_context_destroy - closes every listener and pipe (their pending
 * operations fail with TP_ECLOSED), waits for their callbacks, frees.
 * Pipes and listeners must not be used afterwards except to unref them.
 * Not from a callback. NULL is a no-op.
 */
TP_API void tp_context_destroy(tp_context *ctx);
/** tp_context_name - the name peers see. */
TP_API const char *tp_context_name(const tp_context *ctx);
/**
 * tp_context_report - a multi-line text: each registered transport and
 * channel, whether it is used and if not why. Caller frees with tp_free().
 */
TP_API char *tp_context_report(const tp_context *ctx);

/**
 * tp_context_listen - listens on every transport of the context. @urls
 * (may be NULL) lists addresses for some transports
 * ("tcp://127.0.0.1:0", "tcp://[::1]:5000", "shm://"); the others listen
 * on their default address.
 */
TP_API tp_status tp_context_listen(tp_context *ctx, const char *const *urls,
                                   size_t nurls, tp_pipe_listener **l_p,
                                   tp_error **err_p);
/**
 * tp_pipe_listener_addr - the bound URL of transport @transport ("tcp",
 * "shm"), or NULL if it does not listen on it. The first listed (the
 * best transport) if @transport is NULL. Valid until the listener is
 * destroyed.
 */
TP_API const char *tp_pipe_listener_addr(const tp_pipe_listener *l,
                                         const char *transport);
/**
 * tp_pipe_listener_accept - output 0 of @aio: a new tp_pipe * (the caller
 * owns one reference) once its handshake has finished.
 */
TP_API void tp_pipe_listener_accept(tp_pipe_listener *l, tp_aio *aio);
/** tp_pipe_listener_destroy - stops listening; pending accepts fail. */
TP_API void tp_pipe_listener_destroy(tp_pipe_listener *l);

/**
 * tp_context_connect - returns a pipe at once; the connection and
 * handshake go on in the background and operations queue until the pipe
 * is ready. @url: "tcp://host:port", "shm://name". Fails at once only for
 * a malformed URL or a transport the context does not have.
 */
TP_API tp_status tp_context_connect(tp_context *ctx, const char *url,
                                    tp_pipe **pipe_p, tp_error **err_p);

/**
 * tp_pipe_write - sends @msg (borrowed until @aio completes: its buffers
 * must stay valid and unchanged). Completes when every byte has left the
 * buffers.
 */
TP_API void tp_pipe_write(tp_pipe *p, const tp_message *msg, tp_aio *aio);
/**
 * tp_pipe_read_descriptor - step 1 of a read. Output 0 of @aio: a new
 * tp_message (the caller owns it) with the metadata and the length of
 * every payload and tensor, data NULL. The next message's descriptor is
 * not read before this one's tp_pipe_read has been submitted.
 */
TP_API void tp_pipe_read_descriptor(tp_pipe *p, tp_aio *aio);
/**
 * tp_pipe_read - step 2: receives the payloads and tensors of the message
 * returned by the last tp_pipe_read_descriptor into its buffers. A buffer
 * with data NULL is allocated by the pipe (pipe_owned, freed by
 * tp_message_destroy). Lengths must not be changed.
 */
TP_API void tp_pipe_read(tp_pipe *p, tp_message *msg, tp_aio *aio);

/**
 * tp_pipe_wait_ready - waits until the handshake finished (TP_OK) or
 * failed (its error), at most @timeout_ms (0 = no limit).
 */
TP_API tp_status tp_pipe_wait_ready(tp_pipe *p, int64_t timeout_ms,
                                    tp_error **err_p);
/**
 * tp_pipe_report - after the handshake: the transport and channel chosen
 * and why each other one was refused, one line each. Caller frees with
 * tp_free(). NULL before the pipe is ready.
 */
TP_API char *tp_pipe_report(tp_pipe *p);
/** tp_pipe_transport / tp_pipe_channel - chosen names; NULL before ready. */
TP_API const char *tp_pipe_transport(const tp_pipe *p);
TP_API const char *tp_pipe_channel(const tp_pipe *p);
/** tp_pipe_peer - "name at url" of the peer, for messages. */
TP_API const char *tp_pipe_peer(const tp_pipe *p);
/** tp_pipe_close - non-blocking; pending operations fail with TP_ECLOSED. */
TP_API void tp_pipe_close(tp_pipe *p);
TP_API tp_pipe *tp_pipe_ref(tp_pipe *p);
/** tp_pipe_unref - the last reference closes and frees. NULL: no-op. */
TP_API void tp_pipe_unref(tp_pipe *p);

#ifdef __cplusplus
}
#endif
#endif
