// SPDX-License-Identifier: Apache-2.0
// proto.c - the agent's message kinds and the protocols above it
// (proto.h): one table of kinds per process, the protocols' hooks called
// for each agent, extension sections, and what protocols may ask of an
// agent.

#include <pthread.h>
#include <string.h>

#include "ag_impl.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/wire.h"

// ---- message kinds ---------------------------------------------------------

static ag_kind_desc ag_kinds[256];
static pthread_once_t ag_kinds_once = PTHREAD_ONCE_INIT;

static void
kinds_init(void)
{
    ag_kinds[AG_KIND_REQUEST] =
        (ag_kind_desc){.k_name = "REQUEST",
                       .k_request = true,
                       .k_dispatch = tp__ag_serve_request};
    ag_kinds[AG_KIND_RESPONSE] =
        (ag_kind_desc){.k_name = "RESPONSE",
                       .k_request = false,
                       .k_dispatch = tp__ag_serve_reply};
    ag_kinds[AG_KIND_ERROR] = (ag_kind_desc){.k_name = "ERROR",
                                             .k_request = false,
                                             .k_dispatch = tp__ag_serve_reply};
    // The list is made by the build: a clash is a bug of this build.
    TP_ASSERT(tp__agent_nprotos <= TP__PROTO_MAX);
    for (size_t i = 0; i < tp__agent_nprotos; i++) {
        const tp__proto_ops *po = tp__agent_protos[i];
        TP_ASSERT(po->po_id >= 1 && po->po_id <= TP__PROTO_MAX_ID &&
                  po->po_id < AG_WIRE_MAX_SECTIONS);
        for (size_t j = 0; j < i; j++) {
            TP_ASSERT(tp__agent_protos[j]->po_id != po->po_id);
        }
        for (size_t k = 0; k < po->po_nkinds; k++) {
            const tp__proto_kind *pk = &po->po_kinds[k];
            TP_ASSERT(ag_kind_is_proto(pk->pk_kind) &&
                      ag_kinds[pk->pk_kind].k_name == NULL &&
                      pk->pk_on_loop != NULL &&
                      (!pk->pk_note || pk->pk_run == NULL));
            ag_kinds[pk->pk_kind] = (ag_kind_desc){
                .k_name = pk->pk_name,
                .k_request = true,
                .k_dispatch = tp__ag_serve_request,
                .k_proto = pk,
                .k_proto_idx = i,
                .k_note = pk->pk_note,
            };
        }
    }
}

const ag_kind_desc *
tp__ag_kind_get(unsigned kind)
{
    pthread_once(&ag_kinds_once, kinds_init);
    if (kind >= TP_ARRAY_LEN(ag_kinds) || ag_kinds[kind].k_name == NULL) {
        return NULL;
    }
    return &ag_kinds[kind];
}

// ---- protocol states -------------------------------------------------------

void *
tp__ag_proto_state_at(const tp_agent *a, size_t idx)
{
    tp_agent *ma = (tp_agent *)a;
    return atomic_load_explicit(&ma->a_proto[idx], memory_order_acquire);
}

void *
tp__agent_proto_state(const tp_agent *a, const tp__proto_ops *ops)
{
    for (size_t i = 0; i < tp__agent_nprotos; i++) {
        if (tp__agent_protos[i] == ops) {
            return tp__ag_proto_state_at(a, i);
        }
    }
    return NULL;
}

tp_status
tp__ag_protos_attach(tp_agent *a, tp_error **err_p)
{
    pthread_once(&ag_kinds_once, kinds_init);
    for (size_t i = 0; i < tp__agent_nprotos; i++) {
        const tp__proto_ops *po = tp__agent_protos[i];
        void *state = NULL;
        tp_status st = po->po_attach(a, &state, err_p);
        if (st != TP_OK) {
            tp__ag_protos_detach(a);
            return tp__error_wrap(err_p, st, "rpc init of %s: protocol %s",
                                  ag_name(a), po->po_name);
        }
        atomic_store_explicit(&a->a_proto[i], state, memory_order_release);
    }
    return TP_OK;
}

void
tp__ag_protos_detach(tp_agent *a)
{
    for (size_t i = 0; i < tp__agent_nprotos; i++) {
        void *state = atomic_exchange_explicit(&a->a_proto[i], NULL,
                                               memory_order_acq_rel);
        if (state != NULL) {
            tp__agent_protos[i]->po_detach(state);
        }
    }
}

// ---- extension sections ----------------------------------------------------

void
tp__ext_init(tp__ext *x)
{
    x->x_buf = x->x_inline;
    x->x_len = 0;
    x->x_cap = sizeof(x->x_inline);
}

void
tp__ext_fini(tp__ext *x)
{
    if (x->x_buf != x->x_inline) {
        tp__free(x->x_buf);
    }
    tp__ext_init(x);
}

tp_status
tp__ext_append(tp__ext *x, const void *p, size_t n)
{
    if (n > AG_WIRE_MAX_EXT - x->x_len) {
        return TP_EINVAL;
    }
    if (x->x_len + n > x->x_cap) {
        size_t cap = x->x_cap * 2;
        while (cap < x->x_len + n) {
            cap *= 2;
        }
        uint8_t *nb = tp__alloc(cap);
        if (nb == NULL) {
            return TP_ENOMEM;
        }
        memcpy(nb, x->x_buf, x->x_len);
        if (x->x_buf != x->x_inline) {
            tp__free(x->x_buf);
        }
        x->x_buf = nb;
        x->x_cap = cap;
    }
    if (n > 0) {
        memcpy(x->x_buf + x->x_len, p, n);
    }
    x->x_len += n;
    return TP_OK;
}

// Writes the header of section @id starting at @mark, covering what was
// appended after it.
static void
ext_close_section(tp__ext *x, size_t mark, unsigned id)
{
    uint8_t *h = x->x_buf + mark;
    h[0] = (uint8_t)id;
    h[1] = 0;
    tp__put_u16le(h + 2, 0);
    tp__put_u32le(h + 4, (uint32_t)(x->x_len - mark - AG_WIRE_SEC_HDR));
}

tp_status
tp__ag_ext_section(tp__ext *x, unsigned id, const void *p, size_t n)
{
    static const uint8_t zero[AG_WIRE_SEC_HDR];
    size_t mark = x->x_len;
    tp_status st = tp__ext_append(x, zero, sizeof(zero));
    if (st == TP_OK) {
        st = tp__ext_append(x, p, n);
    }
    if (st != TP_OK) {
        x->x_len = mark;
        return st;
    }
    ext_close_section(x, mark, id);
    return TP_OK;
}

// ---- hooks -----------------------------------------------------------------

tp_status
tp__ag_proto_send(tp_agent *a, int to, uint8_t kind, const tp_args *args,
                  const tp_args *req, tp__ext *ext, void **toks, bool *any_p,
                  tp_error **err_p)
{
    static const uint8_t zero[AG_WIRE_SEC_HDR];
    *any_p = false;
    for (size_t i = 0; i < tp__agent_nprotos; i++) {
        toks[i] = NULL;
        const tp__proto_ops *po = tp__agent_protos[i];
        void *state = tp__ag_proto_state_at(a, i);
        if (state == NULL || po->po_send == NULL) {
            continue;
        }
        size_t mark = ext->x_len;
        tp_status st = tp__ext_append(ext, zero, sizeof(zero));
        if (st == TP_OK) {
            st = po->po_send(state, to, kind, args, req, ext, &toks[i], err_p);
        } else {
            tp__error_set(err_p, st, "rpc %s: message extension", ag_name(a));
        }
        if (st != TP_OK) {
            ext->x_len = mark;
            if (*any_p) {
                tp__ag_proto_sent(a, toks, err_p != NULL ? *err_p : NULL);
            }
            *any_p = false;
            return st;
        }
        if (toks[i] != NULL) {
            *any_p = true;
        }
        if (ext->x_len == mark + AG_WIRE_SEC_HDR) {
            ext->x_len = mark; // nothing to say: no section
        } else {
            ext_close_section(ext, mark, po->po_id);
        }
    }
    return TP_OK;
}

void
tp__ag_proto_sent(tp_agent *a, void **toks, const tp_error *err)
{
    for (size_t i = 0; i < tp__agent_nprotos; i++) {
        if (toks[i] == NULL) {
            continue;
        }
        void *tok = toks[i];
        toks[i] = NULL;
        void *state = tp__ag_proto_state_at(a, i);
        if (state != NULL) {
            tp__agent_protos[i]->po_sent(state, tok, err);
        }
    }
}

tp_status
tp__ag_proto_recv(tp_agent *a, int from, const ag_hdr *h, tp_args *args,
                  tp_error **err_p)
{
    uint8_t known = 1; // section 0 is the kind's own
    for (size_t i = 0; i < tp__agent_nprotos; i++) {
        known |= (uint8_t)(1u << tp__agent_protos[i]->po_id);
    }
    if ((h->h_sec_mask & ~known) != 0) {
        unsigned id = 0;
        while (((h->h_sec_mask & ~known) & (1u << id)) == 0) {
            id++;
        }
        return tp__error_set(err_p, TP_EPROTO,
                             "rpc message with extension section %u, of no "
                             "protocol of this agent",
                             id);
    }
    for (size_t i = 0; i < tp__agent_nprotos; i++) {
        const tp__proto_ops *po = tp__agent_protos[i];
        void *state = tp__ag_proto_state_at(a, i);
        unsigned id = po->po_id;
        bool has = (h->h_sec_mask & (1u << id)) != 0;
        if (state == NULL || po->po_recv == NULL) {
            if (has) {
                return tp__error_set(err_p, TP_ECLOSED,
                                     "rpc %s: %s section after shutdown",
                                     ag_name(a), po->po_name);
            }
            continue;
        }
        tp_status st = po->po_recv(state, from, has ? h->h_sec[id] : NULL,
                                   has ? h->h_sec_len[id] : 0, args, err_p);
        if (st != TP_OK) {
            return st;
        }
    }
    return TP_OK;
}

void
tp__agent_run_begin(tp_agent *a, const tp_args *in, void *toks[TP__PROTO_MAX])
{
    for (size_t i = 0; i < tp__agent_nprotos; i++) {
        const tp__proto_ops *po = tp__agent_protos[i];
        void *state = tp__ag_proto_state_at(a, i);
        toks[i] = NULL;
        if (state != NULL && po->po_run_begin != NULL) {
            toks[i] = po->po_run_begin(state, in);
        }
    }
}

void
tp__agent_run_end(tp_agent *a, void *toks[TP__PROTO_MAX])
{
    for (size_t i = tp__agent_nprotos; i-- > 0;) {
        const tp__proto_ops *po = tp__agent_protos[i];
        void *state = tp__ag_proto_state_at(a, i);
        if (state != NULL && po->po_run_end != NULL) {
            po->po_run_end(state, toks[i]);
        }
        toks[i] = NULL;
    }
}

void
tp__ag_proto_peer_failed(tp_agent *a, int rank, const tp_error *err)
{
    for (size_t i = 0; i < tp__agent_nprotos; i++) {
        void *state = tp__ag_proto_state_at(a, i);
        if (state != NULL && tp__agent_protos[i]->po_peer_failed != NULL) {
            tp__agent_protos[i]->po_peer_failed(state, rank, err);
        }
    }
}

void
tp__ag_proto_shutdown_begin(tp_agent *a)
{
    for (size_t i = 0; i < tp__agent_nprotos; i++) {
        void *state = tp__ag_proto_state_at(a, i);
        if (state != NULL && tp__agent_protos[i]->po_shutdown_begin != NULL) {
            tp__agent_protos[i]->po_shutdown_begin(state);
        }
    }
}

uint64_t
tp__ag_proto_pending(tp_agent *a)
{
    uint64_t n = 0;
    for (size_t i = 0; i < tp__agent_nprotos; i++) {
        void *state = tp__ag_proto_state_at(a, i);
        if (state != NULL && tp__agent_protos[i]->po_pending != NULL) {
            n += tp__agent_protos[i]->po_pending(state);
        }
    }
    return n;
}

void
tp__ag_proto_shutdown_end(tp_agent *a, bool agreed)
{
    for (size_t i = 0; i < tp__agent_nprotos; i++) {
        void *state = tp__ag_proto_state_at(a, i);
        if (state != NULL && tp__agent_protos[i]->po_shutdown_end != NULL) {
            tp__agent_protos[i]->po_shutdown_end(state, agreed);
        }
    }
}

size_t
tp__ag_proto_debug(tp_agent *a, char *buf, size_t len)
{
    size_t off = 0;
    for (size_t i = 0; i < tp__agent_nprotos; i++) {
        void *state = tp__ag_proto_state_at(a, i);
        if (state != NULL && tp__agent_protos[i]->po_debug != NULL) {
            off += tp__agent_protos[i]->po_debug(
                state, off < len ? buf + off : NULL, off < len ? len - off : 0);
        }
    }
    return off;
}

// ---- the agent, for protocols ----------------------------------------------

tp_agent *
tp__agent_ref(tp_agent *a)
{
    atomic_fetch_add_explicit(&a->a_refs, 1, memory_order_relaxed);
    return a;
}

void
tp__agent_unref(tp_agent *a)
{
    if (a != NULL) {
        tp__ag_agent_unref(a);
    }
}

int
tp__agent_rank(const tp_agent *a)
{
    return a->a_rank;
}

const tp_worker_info *
tp__agent_worker(const tp_agent *a, int rank)
{
    if (rank < 0 || rank >= a->a_world) {
        return NULL;
    }
    return &a->a_peers[rank].p_info;
}

int64_t
tp__agent_timeout(const tp_agent *a, int64_t timeout_ms)
{
    return timeout_ms < 0 ? a->a_opts.rpc_timeout_ms : timeout_ms;
}

tp_status
tp__agent_submit(tp_agent *a, tp_task *task)
{
    tp_status st = TP_ECLOSED;
    tp__mtx_lock(&a->a_mtx);
    if (a->a_state != AG_CLOSED && a->a_pool != NULL) {
        st = tp__pool_submit(a->a_pool, task);
    }
    tp__mtx_unlock(&a->a_mtx);
    return st;
}

void
tp__agent_bind_future(tp_agent *a, tp_future *f)
{
    tp__mtx_lock(&a->a_mtx);
    if (a->a_state != AG_CLOSED && a->a_pool != NULL) {
        tp__future_set_pool(f, a->a_pool);
    }
    tp__mtx_unlock(&a->a_mtx);
}
