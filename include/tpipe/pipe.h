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
 *
 * Threads: every function may be called from any thread. The aio-based
 * ones (tp_pipe_listener_accept, tp_pipe_write, tp_pipe_read_descriptor,
 * tp_pipe_read) never block and may be called from an aio callback; so
 * may tp_context_connect and tp_pipe_listener_destroy, which otherwise
 * wait briefly for the loop thread. Blocking functions (tp_context_destroy,
 * tp_pipe_wait_ready) must not be called from a callback.
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
    void *data;   /* write: source; read: destination, or NULL */
    uint64_t len; /* bytes */
    /* payloads: TP_DEVICE_CPU. Tensors: TP_DEVICE_CPU or TP_DEVICE_CUDA
     * (index = the device). Write: where data is. Read: the descriptor
     * gives the sender's device; set the destination before tp_pipe_read
     * (data NULL: the pipe allocates there). docs/cuda.md */
    tp_device device;
    bool pipe_owned; /* set by the pipe: data was allocated by it */
} tp_msg_buf;

/**
 * tp_message - what a pipe moves. Payloads always travel on the pipe's
 * connection; tensors travel on the negotiated channel (basic, xth, cma,
 * mpt), CUDA tensors staged through pinned host memory (cuda_basic).
 * Lengths are 64-bit.
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
 * Errors: TP_EINVAL (@msg_p NULL), TP_ENOMEM.
 * Thread-safety: any thread; does not block.
 */
TP_API tp_status tp_message_create(uint32_t npayloads, uint32_t ntensors,
                                   tp_message **msg_p);
/**
 * tp_message_destroy - frees a message made by tp_message_create or by
 * tp_pipe_read_descriptor, its metadata if the pipe allocated it, and
 * every buffer marked pipe_owned. Buffers the caller supplied are not
 * freed. NULL is a no-op.
 * Thread-safety: any thread, not while a read or write of @msg is pending.
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

/**
 * tp_context_options_init - defaults (every field 0 / NULL), and @size.
 * NULL is a no-op. Thread-safety: any thread.
 */
TP_API void tp_context_options_init(tp_context_options *o);

/**
 * tp_context_create - starts the loop thread and sets up every allowed
 * transport and channel that works here (those that do not are listed in
 * tp_context_report with the reason). @o may be NULL (defaults).
 * Ownership: *@ctx_p is the caller's; free it with tp_context_destroy.
 * Errors: TP_EINVAL (@ctx_p NULL; @o->size unknown; an unknown name in an
 * allow or deny list, listing the known ones; a bad name or mpt_lanes; a
 * bad TP_* environment value; no usable transport, or no transport and
 * channel that work together, with the report), TP_ENOMEM, and the
 * errors of starting the loop thread.
 * Thread-safety: any thread; blocks while the loop thread starts.
 */
TP_API tp_status tp_context_create(const tp_context_options *o,
                                   tp_context **ctx_p, tp_error **err_p);
/**
 * tp_context_destroy - closes every listener and pipe (their pending
 * operations fail with TP_ECLOSED), waits for their callbacks, frees.
 * Pipes and listeners must not be used afterwards except to unref them.
 * NULL is a no-op.
 * Thread-safety: any thread but the context's loop thread (so not from an
 * aio callback); blocks until the context's objects are quiet.
 */
TP_API void tp_context_destroy(tp_context *ctx);
/**
 * tp_context_name - the name peers see; valid until the context is
 * destroyed. NULL if @ctx is NULL. Thread-safety: any thread.
 */
TP_API const char *tp_context_name(const tp_context *ctx);
/**
 * tp_context_report - a multi-line text: each registered transport and
 * channel, whether it is used and if not why. Caller frees with tp_free().
 * Errors: NULL if @ctx is NULL or memory ran out.
 * Thread-safety: any thread.
 */
TP_API char *tp_context_report(const tp_context *ctx);

/**
 * tp_context_listen - listens on every transport of the context. @urls
 * (may be NULL) lists addresses for some transports
 * ("tcp://127.0.0.1:0", "tcp://[::1]:5000", "shm://"); the others listen
 * on their default address.
 * Ownership: *@l_p is the caller's; free it with tp_pipe_listener_destroy.
 * Errors: TP_EINVAL (@ctx or @l_p NULL, @urls NULL with @nurls > 0, a URL
 * that is not of a transport this context uses), TP_ENOMEM, and the
 * transport's listen errors (TP_EADDRINUSE, TP_EPERM, TP_EINVAL for an
 * address it cannot parse, ...), wrapped with the context's name.
 * Thread-safety: any thread, also an aio callback.
 */
TP_API tp_status tp_context_listen(tp_context *ctx, const char *const *urls,
                                   size_t nurls, tp_pipe_listener **l_p,
                                   tp_error **err_p);
/**
 * tp_pipe_listener_addr - the bound URL of transport @transport ("tcp",
 * "shm"), or NULL if it does not listen on it. The first listed (the
 * best transport) if @transport is NULL. Valid until the listener is
 * destroyed. NULL if @l is NULL. Thread-safety: any thread.
 */
TP_API const char *tp_pipe_listener_addr(const tp_pipe_listener *l,
                                         const char *transport);
/**
 * tp_pipe_listener_addrs - the bound URLs of every transport @l listens
 * on, in the order a peer should try them: first the best transport that
 * reaches other hosts (tcp: a pipe it opens moves to shared memory when
 * both ends are on one host and allow it), then the others, best first.
 * This is the order to publish in a rendezvous. Fills @addrs with at most
 * @max of them (valid until the listener is destroyed) and returns how
 * many there are in all (0 if @l is NULL; @addrs may be NULL when @max
 * is 0). Thread-safety: any thread.
 */
TP_API size_t tp_pipe_listener_addrs(const tp_pipe_listener *l,
                                     const char **addrs, size_t max);
/**
 * tp_pipe_listener_accept - output 0 of @aio: a new tp_pipe * (the caller
 * owns one reference) once its handshake has finished.
 * Completion: @aio's callback runs once, on the loop thread, never inside
 * this call. @l and @aio must not be NULL: with no loop to complete @aio
 * on there is no way to report it, so it is not checked.
 * Errors (in @aio): TP_ECLOSED (the listener or its context is being
 * destroyed), TP_ETIMEDOUT (the aio's timeout), TP_ECANCELED.
 * Thread-safety: any thread, also an aio callback; does not block.
 */
TP_API void tp_pipe_listener_accept(tp_pipe_listener *l, tp_aio *aio);
/**
 * tp_pipe_listener_destroy - stops listening; pending accepts fail with
 * TP_ECLOSED. Pipes already accepted are untouched. NULL is a no-op.
 * Thread-safety: any thread, also an aio callback; waits briefly for the
 * loop thread when called from another thread.
 */
TP_API void tp_pipe_listener_destroy(tp_pipe_listener *l);

/**
 * tp_context_connect - returns a pipe at once; the connection and
 * handshake go on in the background and operations queue until the pipe
 * is ready. @url: "tcp://host:port", "shm://name". Fails at once only for
 * a malformed URL or a transport the context does not have.
 * Ownership: *@pipe_p is a reference owned by the caller (tp_pipe_unref).
 * Errors: TP_EINVAL (@ctx, @url or @pipe_p NULL, a malformed URL, a
 * transport not in use here, with the report), TP_ENOMEM. A failed
 * connection or handshake (TP_ECONNREFUSED, TP_ETIMEDOUT, TP_EPROTO, ...)
 * fails the pipe later: tp_pipe_wait_ready and every operation return it.
 * Thread-safety: any thread, also an aio callback; waits briefly for the
 * loop thread when called from another thread.
 */
TP_API tp_status tp_context_connect(tp_context *ctx, const char *url,
                                    tp_pipe **pipe_p, tp_error **err_p);

/**
 * tp_pipe_write - sends @msg (borrowed until @aio completes: its buffers
 * must stay valid and unchanged). Completes when every byte has left the
 * buffers.
 * Completion: @aio's callback runs once, on the loop thread, never inside
 * this call. @p and @aio must not be NULL (not checked: no loop to
 * complete @aio on).
 * Errors (in @aio): TP_EINVAL (@msg NULL, a length above the pipe limits,
 * data NULL with a length, a payload not on the CPU, a tensor on a device
 * that does not exist here), TP_ENOTSUP (a CUDA tensor where CUDA is not
 * usable, with the reason), TP_EDEVICE (staging a CUDA tensor through host
 * memory failed), TP_ENOMEM, the pipe's error
 * once it failed (TP_ECLOSED after tp_pipe_close, TP_ECONNRESET,
 * TP_EPROTO, the handshake's error, ...), TP_ETIMEDOUT / TP_ECANCELED
 * (before the write started; after, they fail the pipe).
 * Thread-safety: any thread, also an aio callback; does not block.
 */
TP_API void tp_pipe_write(tp_pipe *p, const tp_message *msg, tp_aio *aio);
/**
 * tp_pipe_read_descriptor - step 1 of a read. Output 0 of @aio: a new
 * tp_message (the caller owns it) with the metadata and the length of
 * every payload and tensor, data NULL. The next message's descriptor is
 * not read before this one's tp_pipe_read has been submitted.
 * Completion: as tp_pipe_write; @p and @aio must not be NULL (not
 * checked).
 * Errors (in @aio): the pipe's error once it failed (TP_ECLOSED,
 * TP_ECONNRESET, TP_EPROTO for a malformed or oversized descriptor, ...),
 * TP_ENOMEM, TP_ETIMEDOUT / TP_ECANCELED (before a byte of the descriptor
 * arrived; in the middle of one they fail the pipe).
 * Thread-safety: any thread, also an aio callback; does not block.
 */
TP_API void tp_pipe_read_descriptor(tp_pipe *p, tp_aio *aio);
/**
 * tp_pipe_read - step 2: receives the payloads and tensors of the message
 * returned by the last tp_pipe_read_descriptor into its buffers. A buffer
 * with data NULL is allocated by the pipe (pipe_owned, freed by
 * tp_message_destroy). Lengths must not be changed.
 * Completion: as tp_pipe_write; @p and @aio must not be NULL (not
 * checked).
 * Errors (in @aio): TP_EINVAL (no descriptor waiting for its data, or
 * @msg is not the one it returned; a tensor destination on a device that
 * does not exist here), TP_ENOTSUP (a CUDA destination where CUDA is not
 * usable), TP_EDEVICE (the copy to the device failed): these three fail
 * the read only, once its bytes arrived, and the pipe goes on.
 * TP_ENOMEM, the pipe's error once it
 * failed, TP_ETIMEDOUT / TP_ECANCELED (these fail the pipe: the data was
 * arriving).
 * Thread-safety: any thread, also an aio callback; does not block.
 */
TP_API void tp_pipe_read(tp_pipe *p, tp_message *msg, tp_aio *aio);

/**
 * tp_pipe_wait_ready - waits until the handshake finished (TP_OK) or
 * failed (its error), at most @timeout_ms (0 = no limit).
 * Errors: TP_EINVAL (@p NULL), TP_ETIMEDOUT (@timeout_ms passed; the
 * handshake goes on), else the pipe's error (a new reference in *@err_p):
 * TP_ECONNREFUSED, TP_ETIMEDOUT (the connect or handshake timeout),
 * TP_EPROTO, TP_ECLOSED, ...
 * Thread-safety: any thread but a loop thread (not from an aio callback);
 * blocks.
 */
TP_API tp_status tp_pipe_wait_ready(tp_pipe *p, int64_t timeout_ms,
                                    tp_error **err_p);
/**
 * tp_pipe_report - after the handshake: the transport and channel chosen
 * and why each other one was refused, one line each. Caller frees with
 * tp_free(). NULL before the pipe is ready, if @p is NULL, or if memory
 * ran out. Thread-safety: any thread.
 */
TP_API char *tp_pipe_report(tp_pipe *p);
/**
 * tp_pipe_transport / tp_pipe_channel - chosen names (static strings);
 * NULL before ready or if @p is NULL. Thread-safety: any thread.
 */
TP_API const char *tp_pipe_transport(const tp_pipe *p);
TP_API const char *tp_pipe_channel(const tp_pipe *p);
/**
 * tp_pipe_device_channel - the channel that carries the tensors on a CUDA
 * device at the writer ("cuda_ipc"; static string), or NULL when the pipe
 * has none (they are staged through host memory over the pipe's channel;
 * docs/cuda.md) or is not ready.
 */
TP_API const char *tp_pipe_device_channel(const tp_pipe *p);
/**
 * tp_pipe_peer - "name at url" of the peer, for messages; valid while the
 * caller holds a reference. NULL if @p is NULL. Thread-safety: any thread.
 */
TP_API const char *tp_pipe_peer(const tp_pipe *p);
/**
 * tp_pipe_close - pending and later operations fail with TP_ECLOSED; the
 * peer sees the connection close. Idempotent; NULL is a no-op.
 * Thread-safety: any thread, also an aio callback; does not block.
 */
TP_API void tp_pipe_close(tp_pipe *p);
/**
 * tp_pipe_ref - takes one more reference; returns @p (NULL for NULL).
 * Thread-safety: any thread.
 */
TP_API tp_pipe *tp_pipe_ref(tp_pipe *p);
/**
 * tp_pipe_unref - the last reference closes and frees. NULL: no-op.
 * Thread-safety: any thread, also an aio callback; does not block.
 */
TP_API void tp_pipe_unref(tp_pipe *p);

#ifdef __cplusplus
}
#endif
#endif
