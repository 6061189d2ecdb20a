// SPDX-License-Identifier: Apache-2.0
// builtins.c - functions every agent offers: tp.noop, tp.echo, tp.add.

#include <string.h>

#include "agent_int.h"
#include "core/elementwise.h"
#include "core/log.h"
#include "core/tensor_impl.h"

static tp_status
builtin_noop(const tp_rpc_call_info *call, const tp_args *in, void *arg,
             tp_args **out_p, tp_error **err_p)
{
    TP_UNUSED(call);
    TP_UNUSED(in);
    TP_UNUSED(arg);
    TP_UNUSED(err_p);
    *out_p = NULL;
    return TP_OK;
}

// The result is the arguments themselves: the received bytes and tensors
// go back without a copy.
static tp_status
builtin_echo(const tp_rpc_call_info *call, const tp_args *in, void *arg,
             tp_args **out_p, tp_error **err_p)
{
    TP_UNUSED(call);
    TP_UNUSED(arg);
    TP_UNUSED(err_p);
    *out_p = in != NULL ? tp_args_ref((tp_args *)in) : NULL;
    return TP_OK;
}

static tp_status
builtin_add(const tp_rpc_call_info *call, const tp_args *in, void *arg,
            tp_args **out_p, tp_error **err_p)
{
    TP_UNUSED(call);
    TP_UNUSED(arg);
    if (tp_args_ntensors(in) != 2) {
        return tp__error_set(err_p, TP_EINVAL,
                             "tp.add: expected 2 tensors, got %zu",
                             tp_args_ntensors(in));
    }
    tp_tensor *a = tp_args_tensor(in, 0);
    tp_tensor *b = tp_args_tensor(in, 1);
    tp_dtype dt = tp_tensor_dtype(a);
    int nd = tp_tensor_ndim(a);
    if (tp_tensor_dtype(b) != dt || tp_tensor_ndim(b) != nd ||
        memcmp(tp_tensor_shape(a), tp_tensor_shape(b),
               (size_t)nd * sizeof(int64_t)) != 0) {
        return tp__error_set(err_p, TP_EINVAL,
                             "tp.add: the tensors differ in dtype or shape "
                             "(%s[%d dims] and %s[%d dims])",
                             tp_dtype_name(dt), nd,
                             tp_dtype_name(tp_tensor_dtype(b)),
                             tp_tensor_ndim(b));
    }
    // Core's kernel (core/elementwise.h): integers wrap, f16/bf16 are added
    // in f32 and rounded once, and bool's "or" is its max. Tensors in args
    // are contiguous (tp_args_push_tensor).
    tp__ew_op op = dt == TP_BOOL ? TP__EW_MAX : TP__EW_SUM;
    if (!tp__elementwise_supported(op, dt)) {
        return tp__error_set(err_p, TP_EINVAL,
                             "tp.add: dtype %s is not supported",
                             tp_dtype_name(dt));
    }
    tp_tensor *r = NULL;
    tp_status st = tp_tensor_empty(dt, nd, tp_tensor_shape(a), &r, err_p);
    if (st == TP_OK) {
        tp__elementwise3(op, dt, tp_tensor_data(r), tp_tensor_data(a),
                         tp_tensor_data(b), (size_t)tp_tensor_numel(r));
    }
    tp_args *out = NULL;
    if (st == TP_OK) {
        st = tp__ag_args_create_empty(1, &out);
        if (st != TP_OK) {
            tp__error_set(err_p, st, "tp.add: out of memory");
        } else {
            tp__ag_args_push_tensor(out, r);
            r = NULL;
        }
    }
    tp_tensor_unref(r);
    *out_p = out;
    return st;
}

void
tp__ag_builtins_register(void)
{
    // Cannot fail but for memory at process start; a missing builtin then
    // shows up as "unknown function" on the caller.
    if (tp__ag_registry_add_builtin("tp.noop", builtin_noop) != TP_OK ||
        tp__ag_registry_add_builtin("tp.echo", builtin_echo) != TP_OK ||
        tp__ag_registry_add_builtin("tp.add", builtin_add) != TP_OK) {
        TP_LOG_ERROR("TP-RPC-BUILTIN", "registering the builtins failed");
    }
}
