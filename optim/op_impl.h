/* SPDX-License-Identifier: Apache-2.0 */
/* op_impl.h (internal) - the pieces of the optim layer: options (defaults,
 * checks, names, wire form: options.c), the update rules (rules.c), the
 * local optimizer (optim.c) and the DistributedOptimizer (dist_optim.c). */
#ifndef TP_OPTIM_OP_IMPL_H
#define TP_OPTIM_OP_IMPL_H

#include <stdint.h>

#include <tpipe/optim.h>

/* ---- options (options.c) -------------------------------------------- */

/* Copies @in (its first in->size bytes over the defaults of its kind) to
 * *@out_p and checks it as PyTorch 1.13's constructors do: TP_EINVAL
 * naming the kind, the option and its value. */
tp_status tp__op_options_load(const tp_optim_options *in,
                              tp_optim_options *out_p, tp_error **err_p);

/* The wire form of checked options: OP_OPTIONS_WIRE_LEN bytes,
 * little-endian, field by field (docs/optim.md). */
#define OP_OPTIONS_WIRE_LEN 88
void tp__op_options_encode(const tp_optim_options *o,
                           uint8_t buf[OP_OPTIONS_WIRE_LEN]);
/* Decodes and checks (tp__op_options_load) @len bytes at @buf: TP_EINVAL for
 * a wrong length, version or flag bits, or options that fail the checks. */
tp_status tp__op_options_decode(const uint8_t *buf, size_t len,
                                tp_optim_options *o_p, tp_error **err_p);

/* ---- update rules (rules.c) ----------------------------------------- */

/* The most state buffers a rule keeps per parameter. */
#define OP_MAX_BUFS 3

/* The state of one parameter, allocated at its first step with a
 * gradient (as PyTorch's optimizers fill self.state[p] lazily). */
typedef struct op_state {
    int64_t s_step;           /* steps that had a gradient */
    void *s_buf[OP_MAX_BUFS]; /* numel elements of the parameter's dtype,
                                 NULL where the rule keeps none */
} op_state;

/* Which buffers the rule of @o keeps (@used[i]) and what they start as
 * (@init[i]). */
void tp__op_rule_bufs(const tp_optim_options *o, bool used[OP_MAX_BUFS],
                      double init[OP_MAX_BUFS]);
/* One update of @n elements of dtype @dt (TP_F32 or TP_F64) at @p from
 * the gradient @g, with the state @s: increments s->s_step first. */
void tp__op_rule_apply(const tp_optim_options *o, tp_dtype dt, int64_t n,
                       void *p, const void *g, op_state *s);

#endif
