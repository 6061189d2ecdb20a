// SPDX-License-Identifier: Apache-2.0
// fns.c - send and recv functions. A message whose args hold tensors that
// require grad, sent while a context is current (or replying to a request
// that carried one), records a send function on the sender: a node whose
// inputs are those tensors and whose backward passes the gradients that
// come back through. The receiver wraps the same tensors with a recv
// function: a node without inputs whose backward sends the gradients to
// the sender's send function (backward.c). The message's section says
// which context, which send function and which tensors.

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <tpipe/rpc.h>

#include "agent/agent_int.h"
#include "core/alloc.h"
#include "core/wire.h"
#include "da_impl.h"

// ---- send functions -------------------------------------------------------

// What was sent of each tensor, to check the gradients that come back.
typedef struct send_tensor {
    tp_dtype t_dtype;
    int t_ndim;
    int64_t t_shape[TP_TENSOR_MAX_DIMS];
} send_tensor;

typedef struct send_meta {
    da_state *m_x; // referenced
    int m_n;
    send_tensor m_t[];
} send_meta;

static tp_status
send_backward(tp_node *node, tp_tensor *const *gout, tp_tensor **gin,
              tp_error **err_p)
{
    (void)err_p;
    int n = tp_node_num_inputs(node);
    for (int i = 0; i < n; i++) {
        gin[i] = gout[i] != NULL ? tp_tensor_ref(gout[i]) : NULL;
    }
    return TP_OK;
}

static void
meta_free(send_meta *m)
{
    tp__da_state_unref(m->m_x);
    tp__free(m);
}

static void
send_destroy(tp_node *node)
{
    meta_free(tp_node_arg(node));
}

static const tp_node_ops send_ops = {
    .name = "SendRpcBackward",
    .backward = send_backward,
    .destroy = send_destroy,
};

static send_meta *
meta_new(da_state *x, int n, tp_tensor *const *ts)
{
    send_meta *m = tp__alloc(sizeof(*m) + (size_t)n * sizeof(m->m_t[0]));
    if (m == NULL) {
        return NULL;
    }
    m->m_n = n;
    for (int i = 0; i < n; i++) {
        send_tensor *t = &m->m_t[i];
        t->t_dtype = tp_tensor_dtype(ts[i]);
        t->t_ndim = tp_tensor_ndim(ts[i]);
        memcpy(t->t_shape, tp_tensor_shape(ts[i]),
               (size_t)t->t_ndim * sizeof(int64_t));
    }
    m->m_x = x;
    tp__da_state_ref(x);
    return m;
}

tp_status
tp__da_send_check(tp_node *n, const tp_args *grads, tp_error **err_p)
{
    send_meta *m = tp_node_arg(n);
    size_t ng = tp_args_ntensors(grads);
    if (ng != (size_t)m->m_n) {
        return tp__error_set(err_p, TP_EPROTO,
                             "%zu gradients for a send function of %d "
                             "tensors",
                             ng, m->m_n);
    }
    for (int i = 0; i < m->m_n; i++) {
        const send_tensor *t = &m->m_t[i];
        tp_tensor *g = tp_args_tensor(grads, (size_t)i);
        int nd = tp_tensor_ndim(g);
        if (tp_tensor_dtype(g) != t->t_dtype || nd != t->t_ndim ||
            memcmp(tp_tensor_shape(g), t->t_shape,
                   (size_t)nd * sizeof(int64_t)) != 0) {
            return tp__error_set(err_p, TP_EPROTO,
                                 "gradient %d is %s with %d dims, the tensor "
                                 "sent was %s with %d dims (or another shape)",
                                 i, tp_dtype_name(tp_tensor_dtype(g)), nd,
                                 tp_dtype_name(t->t_dtype), t->t_ndim);
        }
    }
    return TP_OK;
}

tp_node *
tp__da_send_fn(da_ctx *c, uint64_t id)
{
    da_state *x = c->c_x;
    tp_node *n = NULL;
    tp__mtx_lock(&x->x_mtx);
    if (id >= 1 && id <= c->c_nsends) {
        n = tp_node_ref(c->c_sends[id - 1]);
    }
    tp__mtx_unlock(&x->x_mtx);
    return n;
}

tp_status
tp__da_record_send(da_ctx *c, int to, const tp_args *args, tp__ext *ext,
                   tp_error **err_p)
{
    da_state *x = c->c_x;
    size_t nt = args != NULL ? tp_args_ntensors(args) : 0;
    uint32_t *idx = NULL;
    tp_tensor **ts = NULL;
    size_t n = 0;
    for (size_t i = 0; i < nt; i++) {
        n += tp_tensor_requires_grad(tp_args_tensor(args, i));
    }
    if (n > DA_MAX_TENSORS) {
        return tp__error_set(err_p, TP_EINVAL,
                             "dist autograd %s: %zu tensors requiring grad in "
                             "one message (at most %d)",
                             tp__da_name(x), n, DA_MAX_TENSORS);
    }
    if (n > 0) {
        idx = tp__alloc(n * sizeof(*idx));
        ts = tp__alloc(n * sizeof(*ts));
        if (idx == NULL || ts == NULL) {
            tp__free(idx);
            tp__free(ts);
            return tp__error_set(err_p, TP_ENOMEM,
                                 "dist autograd: out of memory");
        }
        n = 0;
        for (size_t i = 0; i < nt; i++) {
            tp_tensor *t = tp_args_tensor(args, i);
            if (tp_tensor_requires_grad(t)) {
                idx[n] = (uint32_t)i;
                ts[n++] = t;
            }
        }
    }
    uint64_t send_id = 0;
    tp_status st = TP_OK;
    tp_node *node = NULL;
    if (n > 0) {
        send_meta *m = meta_new(x, (int)n, ts);
        if (m == NULL) {
            st =
                tp__error_set(err_p, TP_ENOMEM, "dist autograd: out of memory");
        } else {
            st = tp_node_create(&send_ops, m, (int)n, ts, (int)n, &node, err_p);
            if (st != TP_OK) {
                meta_free(m); // no node: its destroy will not run
            }
        }
    }
    tp__mtx_lock(&x->x_mtx);
    if (st == TP_OK && c->c_released) {
        st = tp__error_set(err_p, TP_ENOENT,
                           "dist autograd %s: context %" PRId64 " was released",
                           tp__da_name(x), c->c_id);
    }
    if (st == TP_OK && node != NULL) {
        if (c->c_nsends == c->c_cap_sends) {
            size_t cap = c->c_cap_sends == 0 ? 8 : c->c_cap_sends * 2;
            tp_node **ns = tp__realloc(c->c_sends, cap * sizeof(*ns));
            if (ns == NULL) {
                st = tp__error_set(err_p, TP_ENOMEM,
                                   "dist autograd: out of memory");
            } else {
                c->c_sends = ns;
                c->c_cap_sends = cap;
            }
        }
        if (st == TP_OK) {
            c->c_sends[c->c_nsends++] = node;
            send_id = c->c_nsends;
            node = NULL;
            x->x_st.send_fns++;
        }
    }
    if (st == TP_OK && to >= 0 && to < x->x_world) {
        c->c_peers[to] = true;
    }
    tp__mtx_unlock(&x->x_mtx);
    tp_node_unref(node);
    tp__free(ts);
    if (st != TP_OK) {
        tp__free(idx);
        return st;
    }
    uint8_t fixed[DA_SEC_FIXED];
    tp__da_sec_encode_fixed(c->c_id, send_id, (uint32_t)n, fixed);
    st = tp__ext_append(ext, fixed, sizeof(fixed));
    for (size_t i = 0; i < n && st == TP_OK; i++) {
        uint8_t b[4];
        tp__put_u32le(b, idx[i]);
        st = tp__ext_append(ext, b, 4);
    }
    tp__free(idx);
    if (st != TP_OK) {
        return tp__error_set(err_p, st,
                             "dist autograd %s: a section for %zu tensors",
                             tp__da_name(x), n);
    }
    return TP_OK;
}

// ---- recv functions ---------------------------------------------------------

typedef struct recv_meta {
    da_state *r_x; // referenced
    int64_t r_ctx;
    int r_from;
    uint64_t r_send;
} recv_meta;

static tp_status
recv_backward(tp_node *node, tp_tensor *const *gout, tp_tensor **gin,
              tp_error **err_p)
{
    (void)gin;
    recv_meta *m = tp_node_arg(node);
    da_state *x = m->r_x;
    da_part *p = tp__da_part_current();
    if (p == NULL) {
        return tp__error_set(err_p, TP_EINVAL,
                             "a recv function of dist autograd context "
                             "%" PRId64
                             " was reached outside tp_dist_autograd_backward "
                             "(use it instead of tp_backward)",
                             m->r_ctx);
    }
    da_ctx *c = tp__da_ctx_find(x, m->r_ctx);
    if (c == NULL) {
        return tp__error_set(err_p, TP_ENOENT,
                             "dist autograd %s: context %" PRId64
                             " was released",
                             tp__da_name(x), m->r_ctx);
    }
    tp_status st = tp__da_part_send(p, c, m->r_from, m->r_send, gout,
                                    tp_node_num_outputs(node), err_p);
    tp__da_ctx_unref(c);
    return st;
}

static void
recv_destroy(tp_node *node)
{
    recv_meta *m = tp_node_arg(node);
    da_state *x = m->r_x;
    tp__mtx_lock(&x->x_mtx);
    x->x_st.recv_fns--;
    tp__mtx_unlock(&x->x_mtx);
    tp__da_state_unref(x);
    tp__free(m);
}

static const tp_node_ops recv_ops = {
    .name = "RecvRpcBackward",
    .backward = recv_backward,
    .destroy = recv_destroy,
};

// Names the peer in a decoder's TP_EPROTO.
static tp_status
sec_bad(da_state *x, int from, tp_error **err_p)
{
    const tp_worker_info *wi = tp__agent_worker(x->x_agent, from);
    return tp__error_wrap(err_p, TP_EPROTO,
                          "dist autograd %s: malformed section from %s (rank "
                          "%d)",
                          tp__da_name(x), wi != NULL ? wi->name : "?", from);
}

tp_status
tp__da_record_recv(da_state *x, int from, const uint8_t *sec, size_t len,
                   tp_args *args, da_ctx **c_p, tp_error **err_p)
{
    *c_p = NULL;
    da_sec s;
    if (tp__da_sec_decode(sec, len, (uint32_t)x->x_world,
                          tp_args_ntensors(args), &s, err_p) != TP_OK) {
        return sec_bad(x, from, err_p);
    }
    size_t n = s.s_n;
    int64_t id = s.s_ctx;
    uint64_t send_id = s.s_send;
    for (uint32_t i = 0; i < s.s_n; i++) {
        tp_tensor *t = tp_args_tensor(args, tp__da_sec_idx(&s, i));
        if (!tp_dtype_is_floating(tp_tensor_dtype(t))) {
            tp__error_set(err_p, TP_EPROTO, "tensor %u requires grad but is %s",
                          tp__da_sec_idx(&s, i),
                          tp_dtype_name(tp_tensor_dtype(t)));
            return sec_bad(x, from, err_p);
        }
    }
    da_ctx *c = tp__da_ctx_get_or_add(x, id, from);
    if (c == NULL) {
        // Its creator died (the context ended here): run without one.
        return TP_OK;
    }
    if (n == 0) {
        *c_p = c;
        return TP_OK;
    }
    recv_meta *m = tp__zalloc(sizeof(*m));
    tp_node *node = NULL;
    if (m == NULL) {
        tp__da_ctx_unref(c);
        return tp__error_set(err_p, TP_ENOMEM, "dist autograd: out of memory");
    }
    m->r_x = x;
    tp__da_state_ref(x);
    m->r_ctx = id;
    m->r_from = from;
    m->r_send = send_id;
    tp__mtx_lock(&x->x_mtx);
    x->x_st.recv_fns++;
    tp__mtx_unlock(&x->x_mtx);
    tp_status st = tp_node_create(&recv_ops, m, 0, NULL, (int)n, &node, err_p);
    if (st != TP_OK) {
        // No node: its destroy will not run.
        tp__mtx_lock(&x->x_mtx);
        x->x_st.recv_fns--;
        tp__mtx_unlock(&x->x_mtx);
        tp__da_state_unref(x);
        tp__free(m);
        tp__da_ctx_unref(c);
        return st;
    }
    for (size_t i = 0; i < n && st == TP_OK; i++) {
        uint32_t k = tp__da_sec_idx(&s, (uint32_t)i);
        tp_tensor *t = args->a_tensors[k];
        tp_tensor *v = NULL;
        st = tp_detach(t, &v, err_p);
        if (st == TP_OK) {
            st = tp_tensor_set_grad_fn(v, node, (int)i, err_p);
        }
        if (st == TP_OK) {
            args->a_tensors[k] = v;
            tp_tensor_unref(t);
        } else {
            tp_tensor_unref(v);
        }
    }
    tp_node_unref(node); // the tensors hold it now
    if (st != TP_OK) {
        tp__da_ctx_unref(c);
        return st;
    }
    *c_p = c;
    return TP_OK;
}
