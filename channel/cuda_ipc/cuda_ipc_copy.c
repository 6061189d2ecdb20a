// SPDX-License-Identifier: Apache-2.0
// cuda_ipc_copy.c - the cuda_ipc channel's sends and receives
// (cuda_ipc_impl.h). A send exports the memory handle of the tensor's
// allocation, puts it and the tensor's offset in the info, registers the
// send in this process's table under a random token, and waits for the
// ack. A receive opens the handle on the context's pool, checks that the
// tensor lies inside the allocation it opened, copies to its destination
// and closes the handle, then acks. A receiver in the sender's own process
// (two contexts of one process: the runtime refuses to open a handle of
// its own process) finds the sender's pointer in the table by the token;
// nothing read from the wire is used as an address.

#include <pthread.h>

#include "channel/cuda_ipc/cuda_ipc_impl.h"
#include "core/log.h"
#include "core/platform.h"

// ---- the table of this process's sends --------------------------------------

typedef struct cipc_entry {
    struct cipc_entry *e_next;
    uint64_t e_token;
    const void *e_ptr; // the tensor
    int e_dev;
    uint64_t e_len;
    int e_readers;        // copies from e_ptr in progress (cipc_mtx)
    bool e_orphan;        // its send gave up waiting: the last reader frees it
    int64_t e_wait_ms;    // TP_CUDA_IPC_READER_WAIT_MS
    const char *e_peer;   // the channel's (valid until the send is done)
    uint64_t *e_deadline; // the channel's wait for readers (0: none yet)
    uint32_t e_index;     // the tensor in its message
} cipc_entry;

// Initialised once (pthread_once): the condition variable waits by the
// monotonic clock (tp_cv), which a static initialiser cannot ask for.
static pthread_once_t cipc_once = PTHREAD_ONCE_INIT;
static tp_mtx cipc_mtx;
static tp_cv cipc_cv; // e_readers fell
static cipc_entry *cipc_table;

static void
cipc_table_init(void)
{
    tp__mtx_init(&cipc_mtx);
    tp__cv_init(&cipc_cv);
}

static void
cipc_table_add(cipc_entry *e)
{
    pthread_once(&cipc_once, cipc_table_init);
    tp__mtx_lock(&cipc_mtx);
    e->e_next = cipc_table;
    cipc_table = e;
    tp__mtx_unlock(&cipc_mtx);
}

// The entry for @token, held (its send cannot complete and let its
// buffer go) until cipc_table_release; NULL when there is none.
static cipc_entry *
cipc_table_hold(uint64_t token)
{
    pthread_once(&cipc_once, cipc_table_init);
    tp__mtx_lock(&cipc_mtx);
    cipc_entry *e = cipc_table;
    while (e != NULL && e->e_token != token) {
        e = e->e_next;
    }
    if (e != NULL) {
        e->e_readers++;
    }
    tp__mtx_unlock(&cipc_mtx);
    return e;
}

static void
cipc_table_release(cipc_entry *e)
{
    tp__mtx_lock(&cipc_mtx);
    bool last = --e->e_readers == 0 && e->e_orphan;
    tp__cv_broadcast(&cipc_cv);
    tp__mtx_unlock(&cipc_mtx);
    if (last) {
        tp__free(e); // its send gave up on us (tp__cipc_send_done)
    }
}

void
tp__cipc_send_done(tp_chan_op *op)
{
    cipc_entry *e = op->co_priv;
    if (e == NULL) {
        return;
    }
    op->co_priv = NULL;
    tp__mtx_lock(&cipc_mtx);
    for (cipc_entry **pp = &cipc_table; *pp != NULL; pp = &(*pp)->e_next) {
        if (*pp == e) {
            *pp = e->e_next;
            break;
        }
    }
    // A receiver in this process still copying from the tensor (the send
    // failed under it: the pipe closed): its user must not get the buffer
    // back before the copy is over. One cudaMemcpy bounds the wait; a
    // copy that hangs past TP_CUDA_IPC_READER_WAIT_MS does not hold this
    // loop thread for ever: the send completes, and the entry is left to
    // the copy, which frees it when it returns. The deadline is the
    // channel's, set by its first such wait: a close that fails several
    // sends waits that long at most in all.
    uint64_t deadline = UINT64_MAX;
    if (e->e_readers > 0) {
        if (*e->e_deadline == 0) {
            *e->e_deadline = tp__deadline_after_ms(e->e_wait_ms);
        }
        deadline = *e->e_deadline;
    }
    while (e->e_readers > 0) {
        if (!tp__cv_wait_until(&cipc_cv, &cipc_mtx, deadline)) {
            break;
        }
    }
    bool gave_up = e->e_readers > 0;
    e->e_orphan = gave_up;
    // Once unlocked, an orphan is the reader's to free: copy what the
    // warning says first.
    const char *peer = e->e_peer;
    uint32_t index = e->e_index;
    uint64_t len = e->e_len;
    int dev = e->e_dev;
    int64_t wait_ms = e->e_wait_ms;
    tp__mtx_unlock(&cipc_mtx);
    if (gave_up) {
        TP_LOG_WARN("TP-CUDA-IPC-READER-HUNG",
                    "cuda_ipc: pipe to %s: tensor %" PRIu32 " (%" PRIu64
                    " bytes on cuda:%d): a reader in this process still "
                    "copies from it %" PRId64
                    " ms after its send failed; the send completes "
                    "without it (TP_CUDA_IPC_READER_WAIT_MS), and its "
                    "buffer may still be read until that copy returns",
                    peer, index, len, dev, wait_ms);
        return;
    }
    tp__free(e);
}

// ---- the info ---------------------------------------------------------------

void
tp__cipc_info_encode(const tp__cipc_info *in, tp__chan_info *out)
{
    uint8_t *b = out->ci_bytes;
    b[0] = CIPC_INFO_VERSION;
    b[1] = (uint8_t)in->ci_dev;
    tp__put_u16le(b + 2, 0);
    tp__put_u32le(b + 4, in->ci_pid);
    tp__put_u64le(b + 8, in->ci_token);
    tp__put_u64le(b + 16, in->ci_offset);
    tp__put_u64le(b + 24, in->ci_size);
    memcpy(b + 32, in->ci_handle, TP_CUDA_IPC_HANDLE_LEN);
    out->ci_len = CIPC_INFO_LEN;
}

bool
tp__cipc_info_decode(const tp__chan_info *in, uint64_t len, tp__cipc_info *out,
                     char *why, size_t why_len)
{
    const uint8_t *b = in->ci_bytes;
    if (in->ci_len != CIPC_INFO_LEN) {
        snprintf(why, why_len, "%u info bytes, expected %u", in->ci_len,
                 CIPC_INFO_LEN);
        return false;
    }
    if (b[0] != CIPC_INFO_VERSION || tp__get_u16le(b + 2) != 0) {
        snprintf(why, why_len, "info version %u reserved 0x%04x (want %u, 0)",
                 b[0], tp__get_u16le(b + 2), CIPC_INFO_VERSION);
        return false;
    }
    out->ci_dev = b[1];
    out->ci_pid = tp__get_u32le(b + 4);
    out->ci_token = tp__get_u64le(b + 8);
    out->ci_offset = tp__get_u64le(b + 16);
    out->ci_size = tp__get_u64le(b + 24);
    memcpy(out->ci_handle, b + 32, TP_CUDA_IPC_HANDLE_LEN);
    if (out->ci_offset > out->ci_size || len > out->ci_size - out->ci_offset) {
        snprintf(why, why_len,
                 "%" PRIu64 " bytes at offset %" PRIu64
                 " pass the end of their allocation (%" PRIu64 " bytes)",
                 len, out->ci_offset, out->ci_size);
        return false;
    }
    return true;
}

// ---- send -------------------------------------------------------------------

static tp_error *
cipc_op_err(tp_chan *ch, const tp_chan_op *op, tp_status st,
            const tp_error *cause, const char *what)
{
    return tp__error_new(st, 0, cause,
                         "cuda_ipc: pipe to %s: tensor %u of message %" PRIu64
                         ": %s",
                         ch->c_env.ce_peer, op->co_index, op->co_seq, what);
}

// The handle of the allocation holding @op's tensor, its base and size.
static tp_status
cipc_export_op(const tp_chan_op *op, uint8_t handle[TP_CUDA_IPC_HANDLE_LEN],
               uint64_t *off_p, size_t *size_p, tp_error **err_p)
{
    int dev = op->co_device.index;
    void *base = NULL;
    tp_status st = tp__cuda_mem_range(dev, op->co_buf, &base, size_p, err_p);
    uint64_t off = (uint64_t)((uintptr_t)op->co_buf - (uintptr_t)base);
    if (st == TP_OK && (off > *size_p || op->co_len > *size_p - off)) {
        st = tp__error_set(err_p, TP_EINVAL,
                           "%" PRIu64 " bytes at offset %" PRIu64
                           " pass the end of their allocation (%zu bytes)",
                           op->co_len, off, *size_p);
    }
    if (st == TP_OK) {
        // Fails for memory legacy IPC cannot share (cuMemCreate/VMM
        // allocations, cudaMallocAsync pools).
        st = tp__cuda_ipc_mem_export(dev, base, handle, err_p);
    }
    *off_p = off;
    return st;
}

bool
tp__cipc_accepts(tp_chan *ch, const tp_chan_op *op, char *why, size_t why_len)
{
    if (op->co_device.type != TP_DEVICE_CUDA || op->co_device.index < 0 ||
        op->co_device.index > UINT8_MAX) {
        snprintf(why, why_len, "not on a CUDA device");
        return false;
    }
    if (ch->c_xnext == ch->c_nexports ||
        op->co_index <= ch->c_exports[ch->c_nexports - 1].x_index) {
        ch->c_nexports = ch->c_xnext = 0; // a new message
    }
    cipc_export tmp, *x = ch->c_nexports < CIPC_EXPORTS_MAX
                              ? &ch->c_exports[ch->c_nexports]
                              : &tmp; // full: the send exports again
    tp_error *err = NULL;
    if (cipc_export_op(op, x->x_handle, &x->x_off, &x->x_size, &err) != TP_OK) {
        snprintf(why, why_len, "%s", tp_error_message(err));
        tp_error_unref(err);
        return false;
    }
    x->x_buf = op->co_buf;
    x->x_len = op->co_len;
    x->x_dev = op->co_device.index;
    x->x_index = op->co_index;
    ch->c_nexports += x != &tmp;
    return true;
}

// @op cannot go: it came after close (the pipe failed inside another
// channel's call), or the channel's connection broke earlier (ca_err).
// Then it fails (later, as the contract wants) and true is returned.
static bool
cipc_cannot_go(tp_chan *ch, tp_chan_op *op)
{
    const tp_error *down = ch->c_acks.ca_err;
    if (!ch->c_closed && down == NULL) {
        return false;
    }
    tp__chan_op_fail_later(
        ch->c_env.ce_loop, op,
        ch->c_closed
            ? cipc_op_err(ch, op, TP_ECLOSED, NULL, "the pipe is closing")
            : cipc_op_err(ch, op, tp_error_status(down), down,
                          "the cuda_ipc channel is down"));
    return true;
}

// The export accepts kept for @op's tensor, or NULL; those of tensors
// before it are dropped (they were staged, or the send never came).
static const cipc_export *
cipc_export_take(tp_chan *ch, const tp_chan_op *op)
{
    while (ch->c_xnext < ch->c_nexports &&
           ch->c_exports[ch->c_xnext].x_index < op->co_index) {
        ch->c_xnext++;
    }
    if (ch->c_xnext == ch->c_nexports) {
        return NULL;
    }
    const cipc_export *x = &ch->c_exports[ch->c_xnext];
    if (x->x_index != op->co_index || x->x_buf != op->co_buf ||
        x->x_len != op->co_len || x->x_dev != op->co_device.index) {
        return NULL;
    }
    ch->c_xnext++;
    return x;
}

void
tp__cipc_send(tp_chan *ch, tp_chan_op *op)
{
    op->co_priv = NULL;
    op->co_info.ci_len = 0;
    if (cipc_cannot_go(ch, op)) {
        return;
    }
    if (op->co_device.type != TP_DEVICE_CUDA || op->co_device.index < 0 ||
        op->co_device.index > UINT8_MAX) {
        tp__chan_op_fail_later(
            ch->c_env.ce_loop, op,
            cipc_op_err(ch, op, TP_EINTERNAL, NULL,
                        "the pipe gave cuda_ipc a tensor not on a CUDA "
                        "device"));
        return;
    }
    int dev = op->co_device.index;
    size_t size = 0;
    uint64_t off = 0;
    uint8_t handle[TP_CUDA_IPC_HANDLE_LEN];
    tp_error *err = NULL;
    tp_status st = TP_OK;
    const cipc_export *x = cipc_export_take(ch, op);
    if (x != NULL) {
        // accepts exported it just before (wop_route): no second ask.
        memcpy(handle, x->x_handle, TP_CUDA_IPC_HANDLE_LEN);
        off = x->x_off;
        size = x->x_size;
    } else {
        st = cipc_export_op(op, handle, &off, &size, &err);
    }
    cipc_entry *e = st == TP_OK ? tp__zalloc(sizeof(*e)) : NULL;
    if (st == TP_OK && e == NULL) {
        st = tp__error_set(&err, TP_ENOMEM, "out of memory");
    }
    if (st != TP_OK) {
        char what[64];
        snprintf(what, sizeof(what), "sharing it from cuda:%d", dev);
        tp__chan_op_fail_later(ch->c_env.ce_loop, op,
                               cipc_op_err(ch, op, st, err, what));
        tp_error_unref(err);
        return;
    }
    e->e_token = tp__random_u64();
    e->e_ptr = op->co_buf;
    e->e_dev = dev;
    e->e_len = op->co_len;
    e->e_wait_ms = ch->c_reader_wait_ms;
    e->e_peer = ch->c_env.ce_peer;
    e->e_deadline = &ch->c_reader_deadline;
    e->e_index = op->co_index;
    cipc_table_add(e);
    op->co_priv = e;
    tp__cipc_info info = {dev, (uint32_t)getpid(), e->e_token,
                          off, (uint64_t)size,     {0}};
    memcpy(info.ci_handle, handle, TP_CUDA_IPC_HANDLE_LEN);
    tp__cipc_info_encode(&info, &op->co_info);
    tp__list_append(&ch->c_acks.ca_sends, op);
}

// ---- receive ----------------------------------------------------------------

// Loop thread: the copy of @cp ended.
static void
cipc_copied_task(void *arg)
{
    cipc_copy *cp = arg;
    tp_chan *ch = cp->cp_ch;
    tp_chan_op *op = cp->cp_op;
    tp_error *err = cp->cp_err;
    tp__free(cp);
    ch->c_copies--;
    if (err != NULL) {
        // The peer's tensor could not be read: the pipe fails, as for any
        // tensor whose bytes cannot arrive.
        tp__cipc_fail(ch, tp_error_ref(err));
        op->co_done(op, err);
    } else if (ch->c_closed) {
        op->co_done(op, NULL);
    } else if (!tp__chan_acks_ack(&ch->c_acks, op)) {
        err = tp__error_new(TP_ENOMEM, 0, NULL,
                            "cuda_ipc: pipe to %s: ack: out of memory",
                            ch->c_env.ce_peer);
        tp__cipc_fail(ch, tp_error_ref(err));
        op->co_done(op, err);
    }
    tp__cipc_maybe_free(ch);
}

// Same process: the sender's pointer, from the table.
static tp_status
cipc_copy_local(cipc_copy *cp, int dst_dev, tp_error **err_p)
{
    tp_chan_op *op = cp->cp_op;
    cipc_entry *e = cipc_table_hold(cp->cp_info.ci_token);
    if (e == NULL || e->e_len != op->co_len || e->e_dev != cp->cp_info.ci_dev) {
        if (e != NULL) {
            cipc_table_release(e);
        }
        return tp__error_set(err_p, TP_EPROTO,
                             "protocol error: it names this process (pid "
                             "%u) but no tensor of %" PRIu64
                             " bytes this process is sending under that "
                             "token",
                             cp->cp_info.ci_pid, op->co_len);
    }
    tp_status st = tp__cuda_copy(op->co_buf, dst_dev, e->e_ptr, e->e_dev,
                                 (size_t)op->co_len, err_p);
    cipc_table_release(e);
    return st;
}

// Another process: open its allocation, check the range, copy, close.
static tp_status
cipc_copy_remote(cipc_copy *cp, int dst_dev, tp_error **err_p)
{
    tp_chan_op *op = cp->cp_op;
    // The handle is opened on the destination device (peer access from
    // it); a host destination opens it on the sender's device index when
    // this process has it (else 0).
    int open_dev = dst_dev;
    if (open_dev < 0) {
        open_dev = cp->cp_info.ci_dev < tp__cuda_device_count()
                       ? cp->cp_info.ci_dev
                       : 0;
    }
    void *base = NULL;
    size_t size = 0;
    tp_error *oerr = NULL;
    tp_status st =
        tp__cipc_cache_get(&cp->cp_ch->c_cache, cp->cp_info.ci_handle, open_dev,
                           &base, &size, &oerr);
    if (st != TP_OK) {
        // A handle the runtime refuses is the peer's doing (pipe scope,
        // TP_EPROTO, not the device's TP_EDEVICE); CUDA not usable here
        // (TP_ENOTSUP) or out of memory stay what they are.
        st = st == TP_EDEVICE || st == TP_EINVAL ? TP_EPROTO : st;
        tp__error_set(err_p, st,
                      "the peer's memory handle does not open on cuda:%d: "
                      "%s",
                      open_dev, tp_error_message(oerr));
        tp_error_unref(oerr);
        return st;
    }
    if (cp->cp_info.ci_offset > size ||
        op->co_len > size - cp->cp_info.ci_offset) {
        st = tp__error_set(err_p, TP_EPROTO,
                           "protocol error: %" PRIu64 " bytes at offset "
                           "%" PRIu64 " pass the end of the allocation the "
                           "handle names (%zu bytes)",
                           op->co_len, cp->cp_info.ci_offset, size);
    }
    if (st == TP_OK) {
        st = tp__cuda_copy(op->co_buf, dst_dev,
                           (const uint8_t *)base + cp->cp_info.ci_offset,
                           open_dev, (size_t)op->co_len, err_p);
    }
    tp__cipc_cache_put(&cp->cp_ch->c_cache, base, open_dev);
    return st;
}

// Pool thread.
static void
cipc_copy_task(void *arg)
{
    cipc_copy *cp = arg;
    tp_chan_op *op = cp->cp_op;
    int dst_dev =
        op->co_device.type == TP_DEVICE_CUDA ? op->co_device.index : -1;
    tp_error *err = NULL;
    tp_status st = cp->cp_info.ci_pid == (uint32_t)getpid()
                       ? cipc_copy_local(cp, dst_dev, &err)
                       : cipc_copy_remote(cp, dst_dev, &err);
    if (st != TP_OK) {
        char dst[32];
        snprintf(dst, sizeof(dst), dst_dev < 0 ? "host memory" : "cuda:%d",
                 dst_dev);
        char what[160];
        snprintf(what, sizeof(what),
                 "copying %" PRIu64 " bytes from the peer's cuda:%d (pid %u) "
                 "to %s",
                 op->co_len, cp->cp_info.ci_dev, cp->cp_info.ci_pid, dst);
        cp->cp_err = cipc_op_err(cp->cp_ch, op, st, err, what);
        tp_error_unref(err);
    }
    tp__task_init(&cp->cp_task, cipc_copied_task, cp);
    tp__loop_post(cp->cp_ch->c_env.ce_loop, &cp->cp_task);
}

void
tp__cipc_recv(tp_chan *ch, tp_chan_op *op)
{
    if (cipc_cannot_go(ch, op)) {
        return;
    }
    tp__cipc_info info;
    char why[128];
    if (!tp__cipc_info_decode(&op->co_info, op->co_len, &info, why,
                              sizeof(why))) {
        char what[160];
        snprintf(what, sizeof(what), "protocol error: %s", why);
        tp_error *err = cipc_op_err(ch, op, TP_EPROTO, NULL, what);
        tp__chan_op_fail_later(ch->c_env.ce_loop, op, err);
        return;
    }
    cipc_copy *cp = tp__zalloc(sizeof(*cp));
    if (cp == NULL) {
        tp_error *err = cipc_op_err(ch, op, TP_ENOMEM, NULL, "out of memory");
        tp__chan_op_fail_later(ch->c_env.ce_loop, op, err);
        return;
    }
    cp->cp_ch = ch;
    cp->cp_op = op;
    cp->cp_info = info;
    tp__task_init(&cp->cp_task, cipc_copy_task, cp);
    ch->c_copies++;
    if (tp__pool_submit(ch->c_env.ce_pool, &cp->cp_task) != TP_OK) {
        ch->c_copies--;
        tp__free(cp);
        tp_error *err =
            cipc_op_err(ch, op, TP_ECLOSED, NULL, "the copy pool is closed");
        tp__chan_op_fail_later(ch->c_env.ce_loop, op, err);
    }
}
