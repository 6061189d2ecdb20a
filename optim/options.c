// SPDX-License-Identifier: Apache-2.0
// options.c - the optimizers' options: PyTorch 1.13's defaults per kind,
// the checks its constructors make (their ValueError cases, as TP_EINVAL
// naming the option and its value), the kinds' names, and the wire form
// the DistributedOptimizer sends to the owners.

#include <math.h>
#include <stddef.h>
#include <string.h>

#include "core/error.h"
#include "core/platform.h"
#include "core/wire.h"
#include "op_impl.h"

void
tp_optim_options_init(tp_optim_options *o, tp_optim_kind kind)
{
    memset(o, 0, sizeof(*o));
    o->size = sizeof(*o);
    o->kind = kind;
    o->beta1 = 0.9;
    o->beta2 = 0.999;
    o->alpha = 0.99;
    switch (kind) {
    case TP_OPTIM_SGD:
        // torch.optim.SGD's lr is `required`: NaN until the caller sets it.
        o->lr = NAN;
        o->eps = 1e-8;
        break;
    case TP_OPTIM_ADAGRAD:
        o->lr = 1e-2;
        o->eps = 1e-10;
        break;
    case TP_OPTIM_ADAM:
        o->lr = 1e-3;
        o->eps = 1e-8;
        break;
    case TP_OPTIM_ADAMW:
        o->lr = 1e-3;
        o->eps = 1e-8;
        o->weight_decay = 1e-2;
        break;
    case TP_OPTIM_RMSPROP:
        o->lr = 1e-2;
        o->eps = 1e-8;
        break;
    }
}

const char *
tp_optim_kind_name(tp_optim_kind kind)
{
    switch (kind) {
    case TP_OPTIM_SGD:
        return "sgd";
    case TP_OPTIM_ADAGRAD:
        return "adagrad";
    case TP_OPTIM_ADAM:
        return "adam";
    case TP_OPTIM_ADAMW:
        return "adamw";
    case TP_OPTIM_RMSPROP:
        return "rmsprop";
    }
    return "?";
}

// ---- checks -----------------------------------------------------------------

// `!(v >= 0)` rather than `v < 0`, so that NaN fails too (PyTorch's
// `not 0.0 <= v` does the same).
static tp_status
check_nonneg(const char *kind, const char *name, double v, tp_error **err_p)
{
    if (!(v >= 0)) {
        return tp__error_set(err_p, TP_EINVAL,
                             "optim %s: invalid %s %g: it must be >= 0", kind,
                             name, v);
    }
    return TP_OK;
}

static tp_status
check_beta(const char *kind, const char *name, double v, tp_error **err_p)
{
    if (!(v >= 0 && v < 1)) {
        return tp__error_set(err_p, TP_EINVAL,
                             "optim %s: invalid %s %g: it must be in [0, 1)",
                             kind, name, v);
    }
    return TP_OK;
}

static tp_status
check_sgd(const tp_optim_options *o, tp_error **err_p)
{
    if (isnan(o->lr)) {
        return tp__error_set(err_p, TP_EINVAL,
                             "optim sgd: lr is required (it has no default)");
    }
    tp_status st = check_nonneg("sgd", "lr", o->lr, err_p);
    if (st == TP_OK) {
        st = check_nonneg("sgd", "momentum", o->momentum, err_p);
    }
    if (st == TP_OK) {
        st = check_nonneg("sgd", "weight_decay", o->weight_decay, err_p);
    }
    if (st == TP_OK && o->nesterov && (o->momentum <= 0 || o->dampening != 0)) {
        st = tp__error_set(err_p, TP_EINVAL,
                           "optim sgd: nesterov needs momentum > 0 and "
                           "dampening 0 (momentum %g, dampening %g)",
                           o->momentum, o->dampening);
    }
    return st;
}

static tp_status
check_adagrad(const tp_optim_options *o, tp_error **err_p)
{
    const char *k = "adagrad";
    tp_status st = check_nonneg(k, "lr", o->lr, err_p);
    if (st == TP_OK) {
        st = check_nonneg(k, "lr_decay", o->lr_decay, err_p);
    }
    if (st == TP_OK) {
        st = check_nonneg(k, "weight_decay", o->weight_decay, err_p);
    }
    if (st == TP_OK) {
        st = check_nonneg(k, "initial_accumulator_value",
                          o->initial_accumulator_value, err_p);
    }
    if (st == TP_OK) {
        st = check_nonneg(k, "eps", o->eps, err_p);
    }
    return st;
}

static tp_status
check_adam(const tp_optim_options *o, tp_error **err_p)
{
    const char *k = tp_optim_kind_name(o->kind);
    tp_status st = check_nonneg(k, "lr", o->lr, err_p);
    if (st == TP_OK) {
        st = check_nonneg(k, "eps", o->eps, err_p);
    }
    if (st == TP_OK) {
        st = check_beta(k, "beta1", o->beta1, err_p);
    }
    if (st == TP_OK) {
        st = check_beta(k, "beta2", o->beta2, err_p);
    }
    if (st == TP_OK) {
        st = check_nonneg(k, "weight_decay", o->weight_decay, err_p);
    }
    return st;
}

static tp_status
check_rmsprop(const tp_optim_options *o, tp_error **err_p)
{
    const char *k = "rmsprop";
    tp_status st = check_nonneg(k, "lr", o->lr, err_p);
    if (st == TP_OK) {
        st = check_nonneg(k, "eps", o->eps, err_p);
    }
    if (st == TP_OK) {
        st = check_nonneg(k, "momentum", o->momentum, err_p);
    }
    if (st == TP_OK) {
        st = check_nonneg(k, "weight_decay", o->weight_decay, err_p);
    }
    if (st == TP_OK) {
        st = check_nonneg(k, "alpha", o->alpha, err_p);
    }
    return st;
}

tp_status
tp__op_options_load(const tp_optim_options *in, tp_optim_options *out_p,
                    tp_error **err_p)
{
    size_t need = offsetof(tp_optim_options, kind) + sizeof(in->kind);
    if (in == NULL || in->size < need) {
        return tp__error_set(err_p, TP_EINVAL,
                             "optim: options missing or too short (size %zu; "
                             "use tp_optim_options_init)",
                             in != NULL ? in->size : 0);
    }
    // An older caller's shorter struct gets the defaults of its kind for
    // the fields it does not have.
    tp_optim_options o;
    tp_optim_options_init(&o, in->kind);
    memcpy(&o, in, TP_MIN(in->size, sizeof(o)));
    o.size = sizeof(o);
    tp_status st;
    switch (o.kind) {
    case TP_OPTIM_SGD:
        st = check_sgd(&o, err_p);
        break;
    case TP_OPTIM_ADAGRAD:
        st = check_adagrad(&o, err_p);
        break;
    case TP_OPTIM_ADAM:
    case TP_OPTIM_ADAMW:
        st = check_adam(&o, err_p);
        break;
    case TP_OPTIM_RMSPROP:
        st = check_rmsprop(&o, err_p);
        break;
    default:
        return tp__error_set(err_p, TP_EINVAL,
                             "optim: unknown kind %d (sgd, adagrad, adam, "
                             "adamw and rmsprop are 0..4)",
                             (int)o.kind);
    }
    if (st == TP_OK) {
        *out_p = o;
    }
    return st;
}

// ---- wire form --------------------------------------------------------------
//
// u32le version (OP_WIRE_VERSION), u8 kind, u8 flags (OP_F_*), u16le 0,
// then ten f64 as the u64le of their bits, in the order of op_wire_f64.

#define OP_WIRE_VERSION 1u
enum {
    OP_F_NESTEROV = 1u << 0,
    OP_F_AMSGRAD = 1u << 1,
    OP_F_CENTERED = 1u << 2,
    OP_F_MAXIMIZE = 1u << 3,
    OP_F_ALL = (1u << 4) - 1,
};

#define OP_WIRE_NF64 10
_Static_assert(8 + 8 * OP_WIRE_NF64 == OP_OPTIONS_WIRE_LEN,
               "the wire form is a header and ten f64");

static double *
wire_f64(tp_optim_options *o, int i)
{
    double *f[OP_WIRE_NF64] = {
        &o->lr,        &o->weight_decay, &o->momentum,
        &o->dampening, &o->beta1,        &o->beta2,
        &o->eps,       &o->lr_decay,     &o->initial_accumulator_value,
        &o->alpha,
    };
    return f[i];
}

static uint64_t
f64_bits(double v)
{
    uint64_t u;
    memcpy(&u, &v, sizeof(u));
    return u;
}

static double
bits_f64(uint64_t u)
{
    double v;
    memcpy(&v, &u, sizeof(v));
    return v;
}

void
tp__op_options_encode(const tp_optim_options *o,
                      uint8_t buf[OP_OPTIONS_WIRE_LEN])
{
    tp_optim_options c = *o;
    unsigned flags =
        (c.nesterov ? OP_F_NESTEROV : 0) | (c.amsgrad ? OP_F_AMSGRAD : 0) |
        (c.centered ? OP_F_CENTERED : 0) | (c.maximize ? OP_F_MAXIMIZE : 0);
    tp__put_u32le(buf, OP_WIRE_VERSION);
    buf[4] = (uint8_t)c.kind;
    buf[5] = (uint8_t)flags;
    tp__put_u16le(buf + 6, 0);
    for (int i = 0; i < OP_WIRE_NF64; i++) {
        tp__put_u64le(buf + 8 + 8 * i, f64_bits(*wire_f64(&c, i)));
    }
}

tp_status
tp__op_options_decode(const uint8_t *buf, size_t len, tp_optim_options *o_p,
                      tp_error **err_p)
{
    if (buf == NULL || len != OP_OPTIONS_WIRE_LEN) {
        return tp__error_set(err_p, TP_EINVAL,
                             "optim options: %zu bytes, expected %d", len,
                             OP_OPTIONS_WIRE_LEN);
    }
    uint32_t version = tp__get_u32le(buf);
    if (version != OP_WIRE_VERSION || (buf[5] & ~OP_F_ALL) != 0 ||
        tp__get_u16le(buf + 6) != 0) {
        return tp__error_set(err_p, TP_EINVAL,
                             "optim options: version %u, flags 0x%x, "
                             "reserved 0x%x (expected version %u, flags "
                             "within 0x%x, reserved 0)",
                             version, buf[5], tp__get_u16le(buf + 6),
                             OP_WIRE_VERSION, (unsigned)OP_F_ALL);
    }
    tp_optim_options o;
    tp_optim_options_init(&o, (tp_optim_kind)buf[4]);
    o.nesterov = (buf[5] & OP_F_NESTEROV) != 0;
    o.amsgrad = (buf[5] & OP_F_AMSGRAD) != 0;
    o.centered = (buf[5] & OP_F_CENTERED) != 0;
    o.maximize = (buf[5] & OP_F_MAXIMIZE) != 0;
    for (int i = 0; i < OP_WIRE_NF64; i++) {
        *wire_f64(&o, i) = bits_f64(tp__get_u64le(buf + 8 + 8 * i));
    }
    return tp__op_options_load(&o, o_p, err_p);
}
