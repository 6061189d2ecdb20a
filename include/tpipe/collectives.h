/* SPDX-License-Identifier: Apache-2.0 */
/* collectives.h - process groups, point-to-point and the collectives of
 * torch.distributed (init_process_group, new_group, send/recv/isend/irecv,
 * broadcast, all_reduce, reduce, all_gather, gather, scatter,
 * reduce_scatter, all_to_all, barrier), in C. See docs/collectives.md.
 *
 * A job has world_size processes (ranks). Each calls tp_pg_init with the
 * same init method; it returns when every rank has published its pipe
 * addresses through the store. Pipes between ranks are made on demand, so
 * every pair gets the best transport and channel (shm/cma on one host, tcp
 * or mpt across hosts). When every member of a group runs on one host and
 * cross-memory attach works there, collectives run on a shared-memory
 * segment of the group instead (engine "shm"); otherwise on pipes (engine
 * "pipe"). TP_COLL_ENGINE=pipe|shm|auto forces one.
 *
 * Calls and work handles. Every operation takes a tp_work **: NULL makes
 * the call blocking (it returns the operation's status); non-NULL makes it
 * asynchronous: it returns TP_OK once the operation is queued and hands
 * back a work handle to wait on. Argument errors that can be detected
 * locally (dtype, count, root, device, a non-contiguous CUDA tensor) are
 * returned by the call itself, before any communication, in both forms.
 * Tensors passed to an asynchronous call are referenced by the work until
 * it completes; their contents must not be touched until then.
 *
 * Order. Collectives of one group run in the order they were issued on
 * each rank, and every member must issue the same collectives in the same
 * order (as in torch.distributed). With TP_DEBUG_COLLECTIVES=1 the members
 * compare op, dtype, count and root before each collective and report a
 * mismatch naming the ranks and what each called, instead of hanging.
 * Point-to-point operations do not wait for queued collectives: a send is
 * matched with the recv of the same group, source and tag, in the order
 * both were issued.
 *
 * Failures. Every operation has a deadline: the group's timeout_ms. When a
 * member dies, pending and later operations of its groups fail within
 * about a second with an error naming the rank. After a collective failed
 * (timeout, dead member, mismatch) the group is broken: later collectives
 * fail at once with the first error, since members may disagree about
 * what completed. Point-to-point operations with live peers go on.
 *
 * Threads. The functions may be called from any thread, but the
 * collectives of one group must be issued from one thread at a time (their
 * order is the issue order). Asynchronous collectives run on a thread of
 * the group; blocking ones run on the calling thread once every earlier
 * one has finished. Blocking calls (w_p NULL), tp_work_wait,
 * tp_pg_init, tp_pg_new_group and tp_pg_destroy must not be made from a
 * callback of a work's future (it runs on the group's thread).
 *
 * Errors of operations (returned by a blocking call, or by tp_work_wait):
 * TP_ETIMEDOUT (the group's timeout_ms passed, naming what was awaited),
 * the connection status when a member died (TP_ECONNRESET, TP_ECLOSED,
 * TP_EUNREACHABLE: naming the rank), TP_EREMOTE (another member's
 * collective failed and it told this one), TP_EINVAL (a mismatch found
 * with TP_DEBUG_COLLECTIVES=1, a recv of the wrong size), TP_ECLOSED
 * (the group was destroyed), or the first error of a broken group.
 */
#ifndef TPIPE_COLLECTIVES_H
#define TPIPE_COLLECTIVES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tpipe/error.h>
#include <tpipe/export.h>
#include <tpipe/future.h>
#include <tpipe/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/**
 * tp_reduce_op - how elements from several ranks are combined.
 *   sum, product, min, max: f32 f64 f16 bf16 i8 u8 i32 i64
 *   avg: f32 f64 f16 bf16 (the sum divided by the group size)
 *   band, bor, bxor: i8 u8 i32 i64 bool
 *   min, max: also bool (logical and / or)
 * Integers wrap; f16 and bf16 are combined in f32 and rounded once per
 * step; float min/max propagate NaN.
 */
typedef enum tp_reduce_op {
    TP_REDUCE_SUM,
    TP_REDUCE_PRODUCT,
    TP_REDUCE_MIN,
    TP_REDUCE_MAX,
    TP_REDUCE_AVG,
    TP_REDUCE_BAND,
    TP_REDUCE_BOR,
    TP_REDUCE_BXOR,
} tp_reduce_op;

/** TP_ANY_SOURCE - the src of a recv that takes a message from any rank. */
#define TP_ANY_SOURCE (-1)
/** TP_PG_MAX_WORLD - the largest world size. */
#define TP_PG_MAX_WORLD 4096

typedef struct tp_pg tp_pg;
typedef struct tp_work tp_work;

/**
 * tp_pg_options - initialise with tp_pg_options_init, then change fields.
 * @size (set by the init function to sizeof(tp_pg_options)) lets the
 * struct grow: a library newer than the caller gives the fields past
 * @size their defaults; a size it does not know (a caller built against
 * another version, or a struct not initialised) makes tp_pg_init,
 * tp_pg_new_group and tp_pg_new_subgroups fail with TP_EINVAL.
 */
typedef struct tp_pg_options {
    size_t size;
    /* deadline of every operation of the group, in ms; TP_TIMEOUT_DEFAULT
     * (-1) = TP_COLL_TIMEOUT_MS; 0 = none. Subgroups take their own. */
    int64_t timeout_ms;
    /* deadline of tp_pg_init / tp_pg_new_group; TP_TIMEOUT_DEFAULT =
     * TP_COLL_INIT_TIMEOUT_MS */
    int64_t init_timeout_ms;
    /* pipe allow lists, as tp_context_options (world group only) */
    const char *transports;
    const char *channels;
    /* a name for messages; NULL = "world" / "group<N>" */
    const char *name;
} tp_pg_options;

/**
 * tp_pg_options_init - defaults (timeouts TP_TIMEOUT_DEFAULT, the rest 0 /
 * NULL) and @size. Thread-safety: any thread.
 */
TP_API void tp_pg_options_init(tp_pg_options *o);

/**
 * tp_pg_init - join the world group of @world_size ranks as @rank.
 * @init_method: "env://" (MASTER_ADDR, MASTER_PORT, and RANK / WORLD_SIZE
 *   when @rank / @world_size are -1), "tcp://host:port" (rank 0 hosts the
 *   store), "file:///path".
 * Collective: returns when every rank has joined, or fails at
 * init_timeout_ms naming the ranks that did not.
 * Ownership: *@pg_p is the caller's; free with tp_pg_destroy after its
 *   subgroups.
 * Errors: TP_EINVAL (@init_method or @pg_p NULL, @o->size unknown, a bad
 * rank, world size or timeout, a bad TP_* environment value, a world-size
 * disagreement or a rank used twice, failing every member), TP_ETIMEDOUT
 * (init_timeout_ms, naming the missing ranks), TP_ENOMEM, the store's
 * errors (TP_ECONNREFUSED, TP_EADDRINUSE for rank 0's tcp:// store, ...)
 * and the pipe context's (tp_context_create, tp_context_listen).
 * Thread-safety: any thread; blocks.
 */
TP_API tp_status tp_pg_init(const char *init_method, int rank, int world_size,
                            const tp_pg_options *o, tp_pg **pg_p,
                            tp_error **err_p);

/**
 * tp_pg_new_group - a subgroup of @world (the world group) made of the
 * @n world ranks in @ranks (distinct, any order; the group rank of
 * ranks[i] is its position in sorted order, as in torch.distributed).
 * Only members take part: a member blocks until every member has called
 * it (init_timeout_ms); a non-member returns TP_OK at once with *@pg_p
 * NULL. Members must create groups with the same rank set in the same
 * order; other groups may be created in between.
 * Ownership: *@pg_p is the caller's (tp_pg_destroy, before @world's).
 * Errors: TP_EINVAL (@pg_p NULL, @o->size unknown, @world NULL or not the
 * world group, @ranks NULL, @n out of 1..size, a rank out of range or
 * listed twice), TP_ETIMEDOUT (init_timeout_ms), TP_EREMOTE (another
 * member gave up, with its reason), TP_ENOMEM, store errors.
 * Thread-safety: any thread; blocks (members only).
 */
TP_API tp_status tp_pg_new_group(tp_pg *world, const int *ranks, int n,
                                 const tp_pg_options *o, tp_pg **pg_p,
                                 tp_error **err_p);
/**
 * tp_pg_new_subgroups - splits @world (the world group) into groups of
 * @group_size consecutive ranks (torch's new_subgroups): world ranks
 * [k*group_size, (k+1)*group_size) make group k. Every rank calls it and
 * gets its own group in *@pg_p (named "subgroup<k>", or o->name followed
 * by k), made as with tp_pg_new_group (it blocks until the group's members
 * have called it). Ownership: *@pg_p is the caller's (tp_pg_destroy).
 * Errors: TP_EINVAL (@pg_p NULL, @world NULL or not the world group,
 * @group_size < 1, or the world size is not a multiple of it), as
 * tp_pg_new_group otherwise.
 * Thread-safety: any thread; blocks.
 */
TP_API tp_status tp_pg_new_subgroups(tp_pg *world, int group_size,
                                     const tp_pg_options *o, tp_pg **pg_p,
                                     tp_error **err_p);

/**
 * tp_pg_destroy - fails every operation of @pg still queued or running
 * with TP_ECLOSED ("destroyed"), waits for the group's thread, closes the
 * group's pipes and segment and drops the caller's handle. Threads inside
 * tp_work_wait on its works wake with that error. The memory goes when
 * the last holder lets go: work handles stay valid (free them with
 * tp_work_free, before or after, from any thread). Destroy subgroups
 * before the world group: subgroups still alive then are destroyed with
 * it (and logged). Not collective. NULL is fine. @pg must not be used by
 * other calls (except tp_work_* on its works) during or after this one.
 * Thread-safety: any thread but the group's own (not from a callback of a
 * work's future); blocks until the group's thread has ended.
 */
TP_API void tp_pg_destroy(tp_pg *pg);

/**
 * tp_pg_rank / tp_pg_size - this process's rank in @pg, its size; -1 and
 * 0 when @pg is NULL. Thread-safety: any thread.
 */
TP_API int tp_pg_rank(const tp_pg *pg);
TP_API int tp_pg_size(const tp_pg *pg);
/**
 * tp_pg_world_rank - the world rank of group rank @group_rank; -1 when
 * @pg is NULL or @group_rank is not a rank of it. Thread-safety: any
 * thread.
 */
TP_API int tp_pg_world_rank(const tp_pg *pg, int group_rank);
/**
 * tp_pg_engine - "shm" or "pipe": where the group's collectives run; ""
 * when @pg is NULL. Static. Thread-safety: any thread.
 */
TP_API const char *tp_pg_engine(const tp_pg *pg);
/**
 * tp_pg_name - the group's name, as used in messages; "" when @pg is NULL.
 * Valid until the group is destroyed. Thread-safety: any thread.
 */
TP_API const char *tp_pg_name(const tp_pg *pg);

/**
 * tp_pg_get_debug_info - the group's flight recorder as text: its last N
 * collectives (N = TP_PG_FLIGHT_RECORDER, default 64, 0 = none kept),
 * oldest first, one line each: "op <n> <kind> seq <s> root <r> bytes <b>
 * state <queued|running|done|failed> issued <t> s ago duration <d> ms"
 * (seq and root are "-" when not known or not rooted; bytes are this
 * rank's input). Point-to-point operations are not recorded.
 * Ownership: *@out_p is NUL-terminated and the caller's (tp_free()).
 * Errors: TP_EINVAL (@pg or @out_p NULL), TP_ENOMEM.
 * Thread-safety: any thread, also while collectives of @pg run (not
 * during or after tp_pg_destroy); does not block on them.
 */
TP_API tp_status tp_pg_get_debug_info(tp_pg *pg, char **out_p,
                                      tp_error **err_p);

/* ---- work handles ------------------------------------------------------ */

/**
 * tp_work_is_completed - true once the operation finished (either way);
 * true for NULL. Thread-safety: any thread; does not block.
 */
TP_API bool tp_work_is_completed(const tp_work *w);
/**
 * tp_work_wait - wait until the operation finished, at most @timeout_ms
 * (0 = until the operation's own deadline). Returns its status, with its
 * error in *@err_p (a new reference). TP_ETIMEDOUT if @timeout_ms passed
 * first: the operation goes on.
 * Errors: TP_EINVAL (@w NULL), TP_ETIMEDOUT, else the operation's status
 * (see "Errors of operations" above).
 * Thread-safety: any thread, several at once, also during tp_pg_destroy
 * (which wakes them with TP_ECLOSED); blocks, so not from a callback of a
 * future of the same group.
 */
TP_API tp_status tp_work_wait(tp_work *w, int64_t timeout_ms, tp_error **err_p);
/**
 * tp_work_error - the error once failed, else NULL (also for NULL).
 * Borrowed: valid until tp_work_free. Thread-safety: any thread.
 */
TP_API const tp_error *tp_work_error(const tp_work *w);
/**
 * tp_work_source - for a completed recv: the group rank the message came
 * from; -1 before then, for other works and for NULL. Thread-safety: any
 * thread.
 */
TP_API int tp_work_source(const tp_work *w);
/**
 * tp_work_get_future - a future of the collective @w (torch's
 * Work.get_future), usable with the future API like an RPC future
 * (tp_future_then, tp_future_wait, tp_future_wait_all).
 * Completion: it resolves when the collective completes: with its output
 * tensor as the value (@t of broadcast, all_reduce and reduce, @out of the
 * others, NULL for barrier and on a non-root of gather; borrowed from the
 * future through tp_future_value), or with the collective's error (the
 * same error tp_work_wait returns). Callbacks added with tp_future_then
 * run on the group's thread when it completes (or on the caller if it
 * already has); they may issue asynchronous collectives, but must not
 * make a blocking call on the same group.
 * Ownership: *@f_p is a new reference (tp_future_unref); each call returns
 * the same future. It outlives @w: freeing the handle does not cancel it.
 * Errors: TP_EINVAL (NULL arguments), TP_ENOTSUP (a point-to-point work:
 * wait for it with tp_work_wait), TP_ENOMEM.
 * Thread safety: any thread.
 */
TP_API tp_status tp_work_get_future(tp_work *w, tp_future **f_p,
                                    tp_error **err_p);
/**
 * tp_work_free - drop the handle. An operation still running goes on to
 * completion (its tensors stay referenced until then). NULL is fine. Any
 * thread, before, during or after the destroy of its group; does not
 * block.
 */
TP_API void tp_work_free(tp_work *w);

/* ---- point to point ------------------------------------------------------
 * Ranks are group ranks. The tensor must be contiguous; a recv's tensor
 * must have the byte size of the message sent (else the recv fails naming
 * both sizes; the send completes). @tag >= 0. A send completes when the
 * tensor may be reused. The deadline (the group's timeout_ms) of an
 * asynchronous send or recv is enforced while it is waited for
 * (tp_work_wait); a pending one is finished with TP_ECLOSED when its group
 * is destroyed.
 * Errors (both): TP_EINVAL (@pg or @t NULL, @t not contiguous or not on
 * the CPU or CUDA, @tag < 0, a rank out of range), TP_ENOTSUP (a CUDA
 * tensor), TP_ENOMEM, TP_EUNREACHABLE (no transport in common with the peer);
 * as the operations (above) otherwise. Thread-safety: any thread; blocking when
 * @w_p is NULL. */

/** tp_pg_send - send @t to group rank @dst with @tag. */
TP_API tp_status tp_pg_send(tp_pg *pg, tp_tensor *t, int dst, int tag,
                            tp_work **w_p, tp_error **err_p);
/** @src: a group rank or TP_ANY_SOURCE (then tp_work_source tells). */
TP_API tp_status tp_pg_recv(tp_pg *pg, tp_tensor *t, int src, int tag,
                            tp_work **w_p, tp_error **err_p);

/* ---- collectives -----------------------------------------------------------
 * Tensors are CPU tensors (or contiguous CUDA tensors when built with NCCL:
 * they go to NCCL). A strided (non-contiguous) CPU tensor, e.g. a
 * transposed view, is copied into a contiguous buffer first and, for an
 * output, the result is copied back into it once the collective
 * succeeded (a copy each way; pass contiguous tensors where that counts).
 * Each rank's tensors must agree with the others' in dtype and element
 * count.
 * Errors (every collective): TP_EINVAL (@pg or a needed tensor NULL, a
 * non-contiguous CUDA tensor, a tensor on another device, @root out of
 * range, dtypes or element counts that do not fit, an @op the dtype does
 * not support), TP_ENOTSUP (CUDA tensors without NCCL), TP_ENOMEM,
 * TP_ECLOSED (the group is being destroyed), the first error of a broken
 * group; as the operations (above) otherwise.
 * Thread-safety: any thread, one at a time per group (the issue order is
 * the order); blocking when @w_p is NULL. */

/** tp_pg_barrier - returns when every member has entered it. */
TP_API tp_status tp_pg_barrier(tp_pg *pg, tp_work **w_p, tp_error **err_p);
/** tp_pg_broadcast - @t of @root is copied into @t of every rank. */
TP_API tp_status tp_pg_broadcast(tp_pg *pg, tp_tensor *t, int root,
                                 tp_work **w_p, tp_error **err_p);
/** tp_pg_all_reduce - @t = op over every rank's @t, in place. */
TP_API tp_status tp_pg_all_reduce(tp_pg *pg, tp_tensor *t, tp_reduce_op op,
                                  tp_work **w_p, tp_error **err_p);
/** tp_pg_reduce - @t of @root = op over every rank's @t; the others' @t
 * are left unchanged. */
TP_API tp_status tp_pg_reduce(tp_pg *pg, tp_tensor *t, int root,
                              tp_reduce_op op, tp_work **w_p, tp_error **err_p);
/**
 * tp_pg_all_reduce_coalesced - all_reduce of the @n tensors @ts (one dtype,
 * CPU) as one operation (torch's all_reduce_coalesced): they are copied
 * into one buffer, reduced with one all_reduce, and the result is copied
 * back into each once it succeeded (a failed call leaves them unchanged).
 * Every member passes tensors of the same element counts in the same
 * order. The work's future resolves with a NULL value.
 * Errors: TP_EINVAL (no tensors, dtypes differ, op), TP_ENOTSUP (CUDA
 * tensors: all_reduce each one), TP_ENOMEM; as all_reduce otherwise.
 */
TP_API tp_status tp_pg_all_reduce_coalesced(tp_pg *pg, tp_tensor *const *ts,
                                            size_t n, tp_reduce_op op,
                                            tp_work **w_p, tp_error **err_p);
/** tp_pg_all_gather - @out (size * numel(@in) elements) = every rank's
 * @in, in rank order (all_gather_into_tensor). */
TP_API tp_status tp_pg_all_gather(tp_pg *pg, tp_tensor *out, tp_tensor *in,
                                  tp_work **w_p, tp_error **err_p);
/** tp_pg_gather - as all_gather, into @out of @root only (NULL on the
 * others). */
TP_API tp_status tp_pg_gather(tp_pg *pg, tp_tensor *out, tp_tensor *in,
                              int root, tp_work **w_p, tp_error **err_p);
/** tp_pg_scatter - @out of rank r = block r of @in of @root (size *
 * numel(@out) elements; NULL on the others). */
TP_API tp_status tp_pg_scatter(tp_pg *pg, tp_tensor *out, tp_tensor *in,
                               int root, tp_work **w_p, tp_error **err_p);
/** tp_pg_reduce_scatter - @out of rank r = op over every rank's block r of
 * @in (size * numel(@out) elements; reduce_scatter_tensor). */
TP_API tp_status tp_pg_reduce_scatter(tp_pg *pg, tp_tensor *out, tp_tensor *in,
                                      tp_reduce_op op, tp_work **w_p,
                                      tp_error **err_p);
/**
 * tp_pg_all_to_all - all_to_all_single: block j of @in goes to rank j,
 * block i of @out comes from rank i. Blocks are rows of dimension 0:
 * @in_splits[j] rows go to rank j, @out_splits[i] rows come from rank i;
 * NULL splits = equal blocks (dim 0 divisible by the size). Each rank's
 * out_splits[i] must equal rank i's in_splits[this rank].
 */
TP_API tp_status tp_pg_all_to_all(tp_pg *pg, tp_tensor *out, tp_tensor *in,
                                  const int64_t *out_splits,
                                  const int64_t *in_splits, tp_work **w_p,
                                  tp_error **err_p);

#ifdef __cplusplus
}
#endif
#endif
