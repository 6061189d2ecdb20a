// SPDX-License-Identifier: Apache-2.0
// args.c - arguments and results of calls: opaque bytes + tensors.

#include "agent_int.h"
#include "proto.h"

#include <string.h>

#include "core/alloc.h"
#include "core/platform.h"
#include "core/tensor_impl.h"

tp_status
tp__ag_args_create_empty(size_t ntensors, tp_args **args_p)
{
    tp_args *a = tp__zalloc(sizeof(*a));
    if (a == NULL) {
        return TP_ENOMEM;
    }
    atomic_init(&a->a_refs, 1);
    if (ntensors > 0) {
        a->a_tensors = tp__zalloc(ntensors * sizeof(tp_tensor *));
        if (a->a_tensors == NULL) {
            tp__free(a);
            return TP_ENOMEM;
        }
        a->a_cap = ntensors;
    }
    *args_p = a;
    return TP_OK;
}

tp_status
tp_args_create(const void *bytes, size_t len, tp_args **args_p)
{
    if (args_p == NULL || (bytes == NULL && len > 0)) {
        return TP_EINVAL;
    }
    tp_args *a;
    tp_status st = tp__ag_args_create_empty(0, &a);
    if (st != TP_OK) {
        return st;
    }
    if (len > 0) {
        a->a_owned = tp__alloc(len);
        if (a->a_owned == NULL) {
            tp__free(a);
            return TP_ENOMEM;
        }
        memcpy(a->a_owned, bytes, len);
        a->a_bytes = a->a_owned;
        a->a_len = len;
    }
    *args_p = a;
    return TP_OK;
}

void
tp__ag_args_push_tensor(tp_args *args, tp_tensor *t)
{
    TP_ASSERT(args->a_ntensors < args->a_cap);
    args->a_tensors[args->a_ntensors++] = t;
}

tp_status
tp_args_add_tensor(tp_args *args, tp_tensor *t)
{
    if (args == NULL || t == NULL || args->a_ntensors >= TP_RPC_MAX_TENSORS) {
        return TP_EINVAL;
    }
    // CUDA tensors travel when a device map covers their device
    // (checked when sent: devmap.c); a strided one is not copied here.
    tp_device dev = tp_tensor_device(t);
    if (dev.type != TP_DEVICE_CPU &&
        (dev.type != TP_DEVICE_CUDA || !tp_tensor_is_contiguous(t))) {
        return TP_ENOTSUP;
    }
    if (args->a_ntensors == args->a_cap) {
        size_t cap = args->a_cap == 0 ? 4 : args->a_cap * 2;
        tp_tensor **nt = tp__realloc(args->a_tensors, cap * sizeof(*nt));
        if (nt == NULL) {
            return TP_ENOMEM;
        }
        args->a_tensors = nt;
        args->a_cap = cap;
    }
    // A view is sent as the contiguous bytes it covers (a copy); a
    // contiguous tensor goes straight from its storage into the pipe.
    // Core's raw copy: sending records no autograd node (distributed
    // autograd, above the agent, records its own send functions).
    // The tensor itself is kept (not an alias): a hook above the agent
    // (distributed autograd) reads its autograd state when it is sent.
    tp_tensor *c;
    if (tp_tensor_is_contiguous(t)) {
        c = tp_tensor_ref(t);
    } else {
        tp_status st = tp__clone_raw(t, &c, NULL);
        if (st != TP_OK) {
            return st;
        }
    }
    tp__ag_args_push_tensor(args, c);
    return TP_OK;
}

tp_args *
tp_args_ref(tp_args *args)
{
    atomic_fetch_add_explicit(&args->a_refs, 1, memory_order_relaxed);
    return args;
}

void
tp_args_unref(tp_args *args)
{
    if (args == NULL || atomic_fetch_sub_explicit(&args->a_refs, 1,
                                                  memory_order_acq_rel) != 1) {
        return;
    }
    for (size_t i = 0; i < args->a_ntensors; i++) {
        tp_tensor_unref(args->a_tensors[i]);
    }
    for (size_t i = 0; i < args->a_nobjs; i++) {
        args->a_objs[i].o_ops->ao_unref(args->a_objs[i].o_ptr);
    }
    tp__free(args->a_objs);
    tp__free(args->a_tensors);
    tp__free(args->a_src_devs);
    tp__free(args->a_owned);
    tp_message_destroy(args->a_msg);
    tp__free(args);
}

const void *
tp_args_bytes(const tp_args *args, size_t *len_p)
{
    if (len_p != NULL) {
        *len_p = args != NULL ? args->a_len : 0;
    }
    return args != NULL ? args->a_bytes : NULL;
}

size_t
tp_args_ntensors(const tp_args *args)
{
    return args != NULL ? args->a_ntensors : 0;
}

tp_tensor *
tp_args_tensor(const tp_args *args, size_t i)
{
    if (args == NULL || i >= args->a_ntensors) {
        return NULL;
    }
    return args->a_tensors[i];
}

uint64_t
tp__ag_args_nbytes(const tp_args *args)
{
    if (args == NULL) {
        return 0;
    }
    uint64_t n = args->a_len;
    for (size_t i = 0; i < args->a_ntensors; i++) {
        n += tp_tensor_nbytes(args->a_tensors[i]);
    }
    return n;
}

tp_status
tp__ag_args_copy(const tp_args *in, bool clone_tensors, void *first,
                 const tp__args_obj_ops *first_ops, tp_args **out_p,
                 tp_error **err_p)
{
    tp_args *out;
    size_t nt = in != NULL ? in->a_ntensors : 0;
    tp_status st = tp__ag_args_create_empty(nt, &out);
    if (st != TP_OK) {
        return tp__error_set(err_p, st, "copying rpc arguments: out of memory");
    }
    if (in != NULL && in->a_len > 0) {
        out->a_owned = tp__alloc(in->a_len);
        if (out->a_owned == NULL) {
            tp_args_unref(out);
            return tp__error_set(err_p, TP_ENOMEM,
                                 "copying rpc arguments: out of memory");
        }
        memcpy(out->a_owned, in->a_bytes, in->a_len);
        out->a_bytes = out->a_owned;
        out->a_len = in->a_len;
    }
    for (size_t i = 0; i < nt; i++) {
        tp_tensor *c = in->a_tensors[i];
        if (!clone_tensors) {
            tp_tensor_ref(c);
        } else if ((st = tp__clone_raw(c, &c, err_p)) != TP_OK) {
            tp_args_unref(out);
            return st;
        }
        tp__ag_args_push_tensor(out, c);
    }
    st = first != NULL ? tp__args_add_obj(out, first, first_ops) : TP_OK;
    for (size_t i = 0; st == TP_OK && in != NULL && i < in->a_nobjs; i++) {
        st = tp__args_add_obj(out, in->a_objs[i].o_ptr, in->a_objs[i].o_ops);
    }
    if (st != TP_OK) {
        tp_args_unref(out);
        return tp__error_set(err_p, st, "copying rpc arguments: out of memory");
    }
    *out_p = out;
    return TP_OK;
}

tp_status
tp__ag_args_clone(const tp_args *in, tp_args **out_p, tp_error **err_p)
{
    return tp__ag_args_copy(in, true, NULL, NULL, out_p, err_p);
}

tp_status
tp__args_add_obj(tp_args *args, void *obj, const tp__args_obj_ops *ops)
{
    if (obj == NULL || ops == NULL) {
        return TP_EINVAL;
    }
    tp_status st = tp__args_add_obj_taken(args, obj, ops);
    if (st == TP_OK) {
        ops->ao_ref(obj);
    }
    return st;
}

tp_status
tp__args_add_obj_taken(tp_args *args, void *obj, const tp__args_obj_ops *ops)
{
    if (args == NULL || obj == NULL || ops == NULL ||
        args->a_nobjs >= AG_MAX_OBJS) {
        return TP_EINVAL;
    }
    if (args->a_nobjs == args->a_objs_cap) {
        size_t cap = args->a_objs_cap == 0 ? 4 : args->a_objs_cap * 2;
        ag_obj *no = tp__realloc(args->a_objs, cap * sizeof(*no));
        if (no == NULL) {
            return TP_ENOMEM;
        }
        args->a_objs = no;
        args->a_objs_cap = cap;
    }
    args->a_objs[args->a_nobjs].o_ptr = obj;
    args->a_objs[args->a_nobjs].o_ops = ops;
    args->a_nobjs++;
    return TP_OK;
}

size_t
tp__args_nobjs(const tp_args *args)
{
    return args != NULL ? args->a_nobjs : 0;
}

void *
tp__args_obj(const tp_args *args, size_t i, const tp__args_obj_ops **ops_p)
{
    if (args == NULL || i >= args->a_nobjs) {
        return NULL;
    }
    if (ops_p != NULL) {
        *ops_p = args->a_objs[i].o_ops;
    }
    return args->a_objs[i].o_ptr;
}
