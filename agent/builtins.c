// SPDX-License-Identifier: Apache-2.0
// builtins.c - functions every agent offers: tp.noop, tp.echo, tp.add.

#include <string.h>

#include "agent_int.h"
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

#define ADD_LOOP(type)                                                         \
    do {                                                                       \
        const type *x = xa;                                                    \
        const type *y = ya;                                                    \
        type *z = za;                                                          \
        for (int64_t i = 0; i < n; i++) {                                      \
            z[i] = (type)(x[i] + y[i]);                                        \
        }                                                                      \
    } while (0)

// z = x + y over @n elements of @dt (f32, f64, integers, bool as "or").
static void
add_kernel(tp_dtype dt, const void *xa, const void *ya, void *za, int64_t n)
{
    switch (dt) {
    case TP_F32:
        ADD_LOOP(float);
        break;
    case TP_F64:
        ADD_LOOP(double);
        break;
    case TP_I8:
        ADD_LOOP(int8_t);
        break;
    case TP_U8:
        ADD_LOOP(uint8_t);
        break;
    case TP_I32:
        ADD_LOOP(int32_t);
        break;
    case TP_I64:
        ADD_LOOP(int64_t);
        break;
    case TP_BOOL: {
        const uint8_t *x = xa;
        const uint8_t *y = ya;
        uint8_t *z = za;
        for (int64_t i = 0; i < n; i++) {
            z[i] = (uint8_t)((x[i] | y[i]) != 0);
        }
        break;
    }
    default:
        TP_ASSERT(!"add_kernel: dtype converted by the caller");
    }
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
    // Half types are added in f32 and rounded back.
    bool half = dt == TP_F16 || dt == TP_BF16;
    tp_dtype cdt = half ? TP_F32 : dt;
    tp_tensor *x = NULL, *y = NULL, *z = NULL, *r = NULL;
    tp_status st = TP_OK;
    if (half) {
        st = tp__to_dtype_raw(a, TP_F32, &x, err_p);
        if (st == TP_OK) {
            st = tp__to_dtype_raw(b, TP_F32, &y, err_p);
        }
    } else {
        x = tp_tensor_ref(a);
        y = tp_tensor_ref(b);
    }
    if (st == TP_OK) {
        st = tp_tensor_empty(cdt, nd, tp_tensor_shape(a), &z, err_p);
    }
    if (st == TP_OK) {
        add_kernel(cdt, tp_tensor_data(x), tp_tensor_data(y), tp_tensor_data(z),
                   tp_tensor_numel(z));
        if (half) {
            st = tp__to_dtype_raw(z, dt, &r, err_p);
        } else {
            r = tp_tensor_ref(z);
        }
    }
    tp_args *out = NULL;
    if (st == TP_OK) {
        st = ag_args_create_empty(1, &out);
        if (st != TP_OK) {
            tp__error_set(err_p, st, "tp.add: out of memory");
        } else {
            ag_args_push_tensor(out, r);
            r = NULL;
        }
    }
    tp_tensor_unref(x);
    tp_tensor_unref(y);
    tp_tensor_unref(z);
    tp_tensor_unref(r);
    *out_p = out;
    return st;
}

void
ag_builtins_register(void)
{
    // Cannot fail but for memory at process start; a missing builtin then
    // shows up as "unknown function" on the caller.
    if (ag_registry_add_builtin("tp.noop", builtin_noop) != TP_OK ||
        ag_registry_add_builtin("tp.echo", builtin_echo) != TP_OK ||
        ag_registry_add_builtin("tp.add", builtin_add) != TP_OK) {
        TP_LOG_ERROR("TP-RPC-BUILTIN", "registering the builtins failed");
    }
}
