// SPDX-License-Identifier: Apache-2.0
// ibv.c - the InfiniBand verbs transport (parts: ibv_impl.h): viability,
// the device and its domain, the bootstrap tcp transport, the ops table.
//
// Viability: the verbs table's probe (a device must open). On a host
// without one it says why: no device from ibv_get_device_list, whether
// /sys/class/infiniband exists, whether the kernel has InfiniBand support
// (/sys/module/ib_core), so `tpipe info` shows it.

#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "transport/ibv/ibv_impl.h"

static const tp_ibv_verbs *ibv_override;

void
tp__ibv_verbs_override(const tp_ibv_verbs *v)
{
    ibv_override = v;
}

const tp_ibv_verbs *
tp__ibv_verbs(void)
{
    return ibv_override != NULL ? ibv_override : &tp__ibv_verbs_real;
}

typedef struct ibv_later {
    tp_task l_task;
    tp_transport *l_t;
} ibv_later;

static void
ibv_later_task(void *arg)
{
    ibv_later *l = arg;
    tp__transport_release(l->l_t);
    tp__free(l);
}

void
tp__ibv_release_later(tp_transport *t)
{
    ibv_later *l = tp__zalloc(sizeof(*l));
    if (l == NULL) {
        return; // ctx_fini then finds the bootstrap busy and says so
    }
    l->l_t = t;
    tp__transport_hold(t);
    tp__task_init(&l->l_task, ibv_later_task, l);
    tp__loop_post(t->t_loop, &l->l_task);
}

static bool
ibv_is_viable(const tp_config *cfg, char *why, size_t why_len)
{
    return tp__ibv_verbs()->probe(cfg, why, why_len);
}

static tp_status
ibv_ctx_init(tp_transport *t, tp_error **err_p)
{
    ibv_ctx *x = ibv_ctx_of(t);
    memset(x, 0, sizeof(*x));
    x->x_t = t;
    x->x_v = tp__ibv_verbs();
    TP_LIST_INIT(&x->x_dead_accepts, ibv_accept_state, as_node);
    const tp_ibv_tunables *it = tp__ibv_tunables_of(&t->t_cfg);
    x->x_ring_size = (uint64_t)it->it_ring_size;
    x->x_pool_max = (unsigned)it->it_pool_max;
    char domain[200] = "";
    tp_status st =
        x->x_v->dev_open(&t->t_cfg, &x->x_dev, domain, sizeof(domain), err_p);
    if (st != TP_OK) {
        return st;
    }
    tp_error *err = NULL;
    st = tp__transport_create("tcp", t->t_loop, &t->t_cfg, &x->x_tcp, &err);
    if (st != TP_OK) {
        x->x_v->dev_close(x->x_dev);
        tp__error_set(err_p, st, "ibv: the bootstrap tcp transport: %s",
                      tp_error_message(err));
        tp_error_unref(err);
        return st;
    }
    tp__ibv_mr_cache_init(&x->x_mrc, x->x_v, x->x_dev);
    // Two ends can connect when their devices share a fabric (the verbs
    // layer's descriptor) and their bootstrap tcp can reach each other.
    snprintf(t->t_domain, sizeof(t->t_domain), "%s+%s", domain,
             tp__transport_domain(x->x_tcp));
    return TP_OK;
}

static void
ibv_ctx_fini(tp_transport *t)
{
    ibv_ctx *x = ibv_ctx_of(t);
    tp__ibv_accepts_free(x);
    tp__transport_destroy_nested(x->x_tcp);
    x->x_tcp = NULL;
    tp__ibv_pool_drain(x);
    tp__ibv_mr_cache_fini(&x->x_mrc);
    x->x_v->dev_close(x->x_dev);
}

const tp_transport_ops tp__transport_ibv_ops = {
    .abi_version = TP_TRANSPORT_ABI_V1,
    .name = "ibv",
    .props = TP_TRANSPORT_PROP_NETWORK,
    .ctx_size = sizeof(ibv_ctx),
    .listener_size = sizeof(ibv_listener),
    .conn_size = sizeof(ibv_conn),
    .tunables = &tp__ibv_tunables,
    .is_viable = ibv_is_viable,
    .ctx_init = ibv_ctx_init,
    .ctx_fini = ibv_ctx_fini,
    .listen = tp__ibv_listen,
    .accept = tp__ibv_accept,
    .listener_close = tp__ibv_listener_close,
    .connect = tp__ibv_connect,
    .conn_read = tp__ibv_conn_read,
    .conn_write = tp__ibv_conn_write,
    .conn_close = tp__ibv_conn_close,
    .conn_fini = tp__ibv_conn_fini,
};
