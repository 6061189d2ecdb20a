// SPDX-License-Identifier: Apache-2.0
// slot.c - the agent's write slots: one pipe write in flight (a message,
// its metadata buffer and what keeps its buffers alive), reused through a
// free list per connection (ag_impl.h has the map of the agent's files).

#include <string.h>

#include "ag_impl.h"
#include "proto.h"
#include "core/alloc.h"

static void slot_write_cb(void *arg);
static void slot_submit(ag_wslot *w);

ag_wslot *
tp__ag_slot_get_locked(ag_conn *c)
{
    ag_wslot *w = c->c_slots;
    if (w != NULL) {
        c->c_slots = w->w_next;
        return w;
    }
    if (c->c_nslots == c->c_slots_cap) {
        size_t cap = c->c_slots_cap == 0 ? 8 : c->c_slots_cap * 2;
        ag_wslot **ns = tp__realloc(c->c_allslots, cap * sizeof(*ns));
        if (ns == NULL) {
            return NULL;
        }
        c->c_allslots = ns;
        c->c_slots_cap = cap;
    }
    w = tp__zalloc(sizeof(*w));
    if (w == NULL) {
        return NULL;
    }
    if (tp_aio_create(slot_write_cb, w, &w->w_aio) != TP_OK) {
        tp__free(w);
        return NULL;
    }
    w->w_conn = c;
    w->w_meta = w->w_meta_inline;
    w->w_meta_cap = sizeof(w->w_meta_inline);
    c->c_allslots[c->c_nslots++] = w;
    return w;
}

void
tp__ag_slot_put_locked(ag_wslot *w)
{
    // A message that was not written (its record still says sent).
    tp__ag_fr_written_locked(w->w_conn->c_agent, w->w_fr_seq, false);
    w->w_fr_seq = 0;
    w->w_next = w->w_conn->c_slots;
    w->w_conn->c_slots = w;
}

void
tp__ag_slot_free(ag_wslot *w)
{
    tp_aio_destroy(w->w_aio);
    if (w->w_meta != w->w_meta_inline) {
        tp__free(w->w_meta);
    }
    tp__free(w->w_tbufs);
    tp_args_unref(w->w_args);
    tp__free(w);
}

// Fills @w's message: metadata from @h and @args, payload 0 = the bytes of
// @args (or @errmsg for an error reply), tensors of @args, each arriving
// on @targets[i] (NULL: the CPU). Takes @args.
static tp_status
slot_fill(ag_wslot *w, const ag_hdr *h, tp_args *args, const char *errmsg,
          const tp_device *targets)
{
    size_t msize = tp__ag_wire_size(h->h_fn_name_len, h->h_ext_len, args);
    if (msize > w->w_meta_cap) {
        uint8_t *m = tp__alloc(msize);
        if (m == NULL) {
            tp_args_unref(args);
            return TP_ENOMEM;
        }
        if (w->w_meta != w->w_meta_inline) {
            tp__free(w->w_meta);
        }
        w->w_meta = m;
        w->w_meta_cap = msize;
    }
    uint32_t nt = args != NULL ? (uint32_t)args->a_ntensors : 0;
    if (nt > w->w_tcap) {
        tp_msg_buf *tb = tp__realloc(w->w_tbufs, nt * sizeof(*tb));
        if (tb == NULL) {
            tp_args_unref(args);
            return TP_ENOMEM;
        }
        w->w_tbufs = tb;
        w->w_tcap = nt;
    }
    tp__ag_wire_encode(w->w_meta, h, args, targets);
    memset(&w->w_msg, 0, sizeof(w->w_msg));
    w->w_msg.metadata = w->w_meta;
    w->w_msg.metadata_len = msize;
    memset(&w->w_payload, 0, sizeof(w->w_payload));
    if (errmsg != NULL) {
        w->w_payload.data = (void *)errmsg;
        w->w_payload.len = strlen(errmsg);
    } else if (args != NULL && args->a_len > 0) {
        w->w_payload.data = (void *)args->a_bytes;
        w->w_payload.len = args->a_len;
    }
    if (w->w_payload.len > 0) {
        w->w_msg.payloads = &w->w_payload;
        w->w_msg.npayloads = 1;
    }
    for (uint32_t i = 0; i < nt; i++) {
        tp_tensor *t = args->a_tensors[i];
        memset(&w->w_tbufs[i], 0, sizeof(tp_msg_buf));
        w->w_tbufs[i].data = tp_tensor_data(t);
        w->w_tbufs[i].len = tp_tensor_nbytes(t);
        w->w_tbufs[i].device = tp_tensor_device(t);
    }
    w->w_msg.tensors = nt > 0 ? w->w_tbufs : NULL;
    w->w_msg.ntensors = nt;
    w->w_args = args;
    w->w_kind = h->h_kind;
    w->w_call_id = h->h_call_id;
    return TP_OK;
}

tp_status
tp__ag_slot_send(ag_wslot *w, ag_hdr *h, bool has_hdr, const void *hdr,
                 size_t hdr_len, tp_args *args, const tp_args *req,
                 const char *errmsg, tp_error **err_p)
{
    tp_agent *a = w->w_conn->c_agent;
    int to = w->w_conn->c_peer != NULL ? w->w_conn->c_peer->p_info.rank : -1;
    tp__ext ext;
    tp__ext_init(&ext);
    bool any_tok = false;
    tp_status st = TP_OK;
    if (has_hdr) {
        st = tp__ag_ext_section(&ext, 0, hdr, hdr_len);
    }
    if (st == TP_OK && errmsg == NULL) {
        st = tp__ag_proto_send(a, to, (uint8_t)h->h_kind, args, req, &ext,
                               w->w_tok, &any_tok, err_p);
    } else if (st != TP_OK) {
        tp__error_set(err_p, st, "rpc %s: a protocol header of %zu bytes",
                      ag_name(a), hdr_len);
    }
    // CUDA tensors: the device each arrives on (device maps, devmap.c);
    // one no map covers is refused here.
    tp_device *targets = NULL;
    size_t nt = errmsg == NULL && args != NULL ? args->a_ntensors : 0;
    for (size_t i = 0; st == TP_OK && i < nt; i++) {
        tp_device src = tp_tensor_device(args->a_tensors[i]);
        if (src.type == TP_DEVICE_CPU) {
            continue;
        }
        if (targets == NULL) {
            targets = tp__zalloc(nt * sizeof(*targets));
            if (targets == NULL) {
                st = tp__error_set(err_p, TP_ENOMEM,
                                   "rpc %s: out of memory for a message",
                                   ag_name(a));
                break;
            }
        }
        st = tp__ag_devmaps_target(a, to, req, i, src, &targets[i], err_p);
    }
    if (st == TP_OK) {
        h->h_ext = ext.x_len > 0 ? ext.x_buf : NULL;
        h->h_ext_len = (uint32_t)ext.x_len;
        st = slot_fill(w, h, args, errmsg, targets);
        args = NULL;
        if (st != TP_OK) {
            tp__error_set(err_p, st, "rpc %s: out of memory for a message",
                          ag_name(a));
        }
    }
    tp__free(targets);
    tp__ext_fini(&ext);
    if (st != TP_OK) {
        tp_args_unref(args);
        if (any_tok) {
            tp_error *e = err_p != NULL ? *err_p : NULL;
            tp__ag_proto_sent(a, w->w_tok, e != NULL ? e : tp__error_nomem());
        }
        return st;
    }
    w->w_any_tok = any_tok;
    if (!tp__ag_faulty_intercept(a, w)) {
        slot_submit(w);
    }
    return TP_OK;
}

// Loop thread: a write completed. Its slot goes back to the connection.
// A connection-scope failure fails the connection (and every call pending
// on it); an operation-scope one (the message broke a pipe limit, memory)
// fails only that message's call.
static void
slot_write_step(ag_wslot *w, const tp_error *werr)
{
    ag_conn *c = w->w_conn;
    tp_agent *a = c->c_agent;
    tp_args *args = w->w_args;
    w->w_args = NULL;
    ag_kind kind = w->w_kind;
    uint64_t call_id = w->w_call_id;
    tp_error *err = tp_error_ref(werr);
    void *toks[TP__PROTO_MAX];
    bool any_tok = w->w_any_tok;
    if (any_tok) {
        memcpy(toks, w->w_tok, sizeof(toks));
        w->w_any_tok = false;
    }

    tp__mtx_lock(&a->a_mtx);
    tp__ag_fr_written_locked(a, w->w_fr_seq, err == NULL);
    w->w_fr_seq = 0;
    tp__ag_slot_put_locked(w);
    tp__mtx_unlock(&a->a_mtx);
    tp_args_unref(args);
    if (any_tok) {
        tp__ag_proto_sent(a, toks, err);
    }
    if (err == NULL) {
        return;
    }
    if (tp__ag_kind_get(kind)->k_note) {
        // A notification that will never arrive: the shutdown agreement
        // must not wait for it.
        tp__mtx_lock(&a->a_mtx);
        a->a_notes_sent--;
        tp__mtx_unlock(&a->a_mtx);
    }
    tp_status wst = tp_error_status(err);
    if (TP_STATUS_IS_CONN(wst) || wst == TP_ETIMEDOUT) {
        // The connection is gone (a write that timed out is TCP's user
        // timeout or keepalive: the peer is unreachable).
        tp__ag_conn_fail(c, err);
    } else {
        tp__ag_write_failed_locally(c, kind, call_id, err);
    }
    tp_error_unref(err);
}

static void
slot_write_cb(void *arg)
{
    ag_wslot *w = arg;
    ag_conn *c = w->w_conn;
    slot_write_step(w, tp_aio_error(w->w_aio));
    tp__ag_conn_op_done(c);
}

// Any thread: writes the message of @w, taken from its connection's free
// list by a caller that counted itself in a_writers.
static void
slot_submit(ag_wslot *w)
{
    atomic_fetch_add_explicit(&w->w_conn->c_ops, 1, memory_order_relaxed);
    tp_pipe_write(w->w_conn->c_pipe, &w->w_msg, w->w_aio);
}

void
tp__ag_slot_run_delayed(ag_wslot *w)
{
    ag_conn *c = w->w_conn;
    tp_error *inject = w->w_inject;
    w->w_inject = NULL;
    if (inject == NULL) {
        // Counted in c_ops when it was queued.
        tp_pipe_write(c->c_pipe, &w->w_msg, w->w_aio);
        return;
    }
    slot_write_step(w, inject);
    tp_error_unref(inject);
    tp__ag_conn_op_done(c);
}
