// SPDX-License-Identifier: Apache-2.0
// rules.c - the update rules of PyTorch 1.13's torch.optim, as its
// single-tensor ("for-loop", foreach=False) functions compute them:
// _single_tensor_sgd, _adagrad, _adam, _adamw and _rmsprop.
//
// Each kernel is one loop over the elements that does, per element, what
// the Python function does with whole tensors, in the same order of
// operations and roundings: `a.mul_(b).add_(c, alpha=s)` is
// `a = fma(s, c, a * b)`, `addcmul_(x, y, value=s)` is `fma(s * x, y, a)`,
// `addcdiv_(x, y, value=s)` is `a + s * x / y` (see OP_RULES for why).
// Scalars PyTorch computes in Python (1 - beta1, lr / bias_correction1,
// ...) are computed here in double, then converted to the element type,
// as ATen converts a Python scalar operand to the tensor's dtype. Against
// PyTorch 1.13 on x86-64 (tests/optim), f64 agrees to about 1e-14 and f32
// mostly to the bit (docs/optim.md).

#include <math.h>

#include "core/platform.h"
#include "op_impl.h"

// K_CLONES: see TP_CLONES (core/platform.h): an x86-64-v3 clone has the
// fma instruction, the default one calls libm's fma (same results).
#define K_CLONES TP_CLONES

// The per-step scalars of one update, from the options and the step.
typedef struct op_coef {
    bool c_maximize;
    double c_lr;
    double c_wd;       // weight decay added to the gradient (0: none)
    double c_momentum; // sgd, rmsprop
    double c_damp1;    // sgd: 1 - dampening
    bool c_nesterov;   // sgd
    bool c_first;      // sgd: the momentum buffer is the gradient itself
    double c_clr;      // adagrad: lr / (1 + (step - 1) * lr_decay)
    double c_eps;
    double c_beta1, c_beta2, c_1mb1, c_1mb2; // adam(w): betas, 1 - betas
    double c_step_size;                      // adam(w): lr / bias_correction1
    double c_bc2_sqrt;                       // adam(w): sqrt(bias_correction2)
    double c_decay;                          // adamw: 1 - lr * weight_decay
    double c_alpha, c_1ma;                   // rmsprop: alpha, 1 - alpha
} op_coef;

// Kernels for one element type T (float, double); SQRT_ and FMA_ are its
// sqrt and fma. `a + s * b` is FMA_(s, b, a) where ATen's CPU kernel for
// that op computes `self + alpha * other` (add with alpha; addcmul's
// `self + (value * t1) * t2`), because ATen's element-wise lambdas are
// compiled with contraction to fused multiply-adds on CPUs that have them
// (and its vectorised add calls vec::fmadd): measured against PyTorch
// 1.13, this makes f32 agree to the last bit where two roundings differed
// by up to 8e-6 after 20 steps. addcdiv's `self + (value * t1) / t2`
// cannot fuse. fma is exactly rounded everywhere, so the result does not
// depend on the clone (TP_CLONES) or the CPU.
#define OP_RULES(T, SFX, SQRT_, FMA_)                                          \
    K_CLONES static void sgd_##SFX(const op_coef *c, int64_t n, T *restrict p, \
                                   const T *restrict g, T *restrict buf)       \
    {                                                                          \
        const T wd = (T)c->c_wd, mom = (T)c->c_momentum;                       \
        const T damp1 = (T)c->c_damp1, nlr = (T)-c->c_lr;                      \
        for (int64_t i = 0; i < n; i++) {                                      \
            T d = c->c_maximize ? -g[i] : g[i];                                \
            if (c->c_wd != 0) {                                                \
                d = FMA_(wd, p[i], d); /* d_p.add(param, alpha=wd) */          \
            }                                                                  \
            if (buf != NULL) {                                                 \
                /* buf.mul_(momentum).add_(d_p, alpha=1 - dampening) */        \
                buf[i] = c->c_first ? d : FMA_(damp1, d, buf[i] * mom);        \
                /* nesterov: d_p.add(buf, alpha=momentum) */                   \
                d = c->c_nesterov ? FMA_(mom, buf[i], d) : buf[i];             \
            }                                                                  \
            p[i] = FMA_(nlr, d, p[i]); /* param.add_(d_p, alpha=-lr) */        \
        }                                                                      \
    }                                                                          \
                                                                               \
    K_CLONES static void adagrad_##SFX(const op_coef *c, int64_t n,            \
                                       T *restrict p, const T *restrict g,     \
                                       T *restrict sum)                        \
    {                                                                          \
        const T wd = (T)c->c_wd, eps = (T)c->c_eps, nclr = (T)-c->c_clr;       \
        for (int64_t i = 0; i < n; i++) {                                      \
            T d = c->c_maximize ? -g[i] : g[i];                                \
            if (c->c_wd != 0) {                                                \
                d = FMA_(wd, p[i], d);                                         \
            }                                                                  \
            sum[i] = FMA_((T)1 * d, d, sum[i]); /* addcmul_(g, g, 1) */        \
            T std = SQRT_(sum[i]) + eps;                                       \
            p[i] = p[i] + nclr * d / std; /* addcdiv_(g, std, -clr) */         \
        }                                                                      \
    }                                                                          \
                                                                               \
    /* Adam and AdamW: AdamW decays the parameter (c_decay) instead of         \
     * adding c_wd * p to the gradient. */                                     \
    K_CLONES static void adam_##SFX(                                           \
        const op_coef *c, int64_t n, T *restrict p, const T *restrict g,       \
        T *restrict m, T *restrict v, T *restrict vmax)                        \
    {                                                                          \
        const T wd = (T)c->c_wd, decay = (T)c->c_decay;                        \
        const T b1 = (T)c->c_beta1, b2 = (T)c->c_beta2;                        \
        const T omb1 = (T)c->c_1mb1, omb2 = (T)c->c_1mb2;                      \
        const T bc2s = (T)c->c_bc2_sqrt, eps = (T)c->c_eps;                    \
        const T nstep = (T)-c->c_step_size;                                    \
        for (int64_t i = 0; i < n; i++) {                                      \
            T d = c->c_maximize ? -g[i] : g[i];                                \
            if (c->c_decay != 1) {                                             \
                p[i] = p[i] * decay; /* param.mul_(1 - lr * wd) */             \
            }                                                                  \
            if (c->c_wd != 0) {                                                \
                d = FMA_(wd, p[i], d);                                         \
            }                                                                  \
            m[i] = FMA_(omb1, d, m[i] * b1);                                   \
            v[i] = FMA_(omb2 * d, d, v[i] * b2);                               \
            T s = v[i];                                                        \
            if (vmax != NULL) {                                                \
                /* torch.maximum: NaN wins. */                                 \
                vmax[i] = (s > vmax[i] || s != s) ? s : vmax[i];               \
                s = vmax[i];                                                   \
            }                                                                  \
            T denom = SQRT_(s) / bc2s + eps;                                   \
            p[i] = p[i] + nstep * m[i] / denom;                                \
        }                                                                      \
    }                                                                          \
                                                                               \
    K_CLONES static void rmsprop_##SFX(                                        \
        const op_coef *c, int64_t n, T *restrict p, const T *restrict g,       \
        T *restrict sq, T *restrict buf, T *restrict gavg)                     \
    {                                                                          \
        const T wd = (T)c->c_wd, alpha = (T)c->c_alpha, oma = (T)c->c_1ma;     \
        const T eps = (T)c->c_eps, mom = (T)c->c_momentum;                     \
        const T nlr = (T)-c->c_lr;                                             \
        for (int64_t i = 0; i < n; i++) {                                      \
            T d = c->c_maximize ? -g[i] : g[i];                                \
            if (c->c_wd != 0) {                                                \
                d = FMA_(wd, p[i], d);                                         \
            }                                                                  \
            sq[i] = FMA_(oma * d, d, sq[i] * alpha);                           \
            T avg;                                                             \
            if (gavg != NULL) {                                                \
                gavg[i] = FMA_(oma, d, gavg[i] * alpha);                       \
                /* square_avg.addcmul(grad_avg, grad_avg, value=-1) */         \
                avg = SQRT_(FMA_((T)-1 * gavg[i], gavg[i], sq[i]));            \
            } else {                                                           \
                avg = SQRT_(sq[i]);                                            \
            }                                                                  \
            avg = avg + eps;                                                   \
            if (buf != NULL) {                                                 \
                buf[i] = buf[i] * mom + (T)1 * d / avg;                        \
                p[i] = FMA_(nlr, buf[i], p[i]);                                \
            } else {                                                           \
                p[i] = p[i] + nlr * d / avg;                                   \
            }                                                                  \
        }                                                                      \
    }

OP_RULES(float, f32, sqrtf, fmaf)
OP_RULES(double, f64, sqrt, fma)

void
tp__op_rule_bufs(const tp_optim_options *o, bool used[OP_MAX_BUFS],
                 double init[OP_MAX_BUFS])
{
    for (int i = 0; i < OP_MAX_BUFS; i++) {
        used[i] = false;
        init[i] = 0;
    }
    switch (o->kind) {
    case TP_OPTIM_SGD:
        used[0] = o->momentum != 0; // momentum_buffer
        break;
    case TP_OPTIM_ADAGRAD:
        used[0] = true; // sum
        init[0] = o->initial_accumulator_value;
        break;
    case TP_OPTIM_ADAM:
    case TP_OPTIM_ADAMW:
        used[0] = used[1] = true; // exp_avg, exp_avg_sq
        used[2] = o->amsgrad;     // max_exp_avg_sq
        break;
    case TP_OPTIM_RMSPROP:
        used[0] = true;            // square_avg
        used[1] = o->momentum > 0; // momentum_buffer
        used[2] = o->centered;     // grad_avg
        break;
    }
}

static void
coef_init(const tp_optim_options *o, int64_t step, op_coef *c)
{
    *c = (op_coef){
        .c_maximize = o->maximize,
        .c_lr = o->lr,
        .c_wd = o->weight_decay,
        .c_momentum = o->momentum,
        .c_eps = o->eps,
        .c_decay = 1,
    };
    double t = (double)step;
    switch (o->kind) {
    case TP_OPTIM_SGD:
        c->c_damp1 = 1 - o->dampening;
        c->c_nesterov = o->nesterov;
        c->c_first = step == 1;
        break;
    case TP_OPTIM_ADAGRAD:
        c->c_clr = o->lr / (1 + (t - 1) * o->lr_decay);
        break;
    case TP_OPTIM_ADAMW:
        c->c_decay = 1 - o->lr * o->weight_decay;
        c->c_wd = 0;
        // fall through
    case TP_OPTIM_ADAM:
        c->c_beta1 = o->beta1;
        c->c_beta2 = o->beta2;
        c->c_1mb1 = 1 - o->beta1;
        c->c_1mb2 = 1 - o->beta2;
        c->c_step_size = o->lr / (1 - pow(o->beta1, t));
        c->c_bc2_sqrt = sqrt(1 - pow(o->beta2, t));
        break;
    case TP_OPTIM_RMSPROP:
        c->c_alpha = o->alpha;
        c->c_1ma = 1 - o->alpha;
        break;
    }
}

void
tp__op_rule_apply(const tp_optim_options *o, tp_dtype dt, int64_t n, void *p,
                  const void *g, op_state *s)
{
    s->s_step++;
    op_coef c;
    coef_init(o, s->s_step, &c);
    void **b = s->s_buf;
    TP_ASSERT(dt == TP_F32 || dt == TP_F64);
    if (dt == TP_F32) {
        switch (o->kind) {
        case TP_OPTIM_SGD:
            sgd_f32(&c, n, p, g, b[0]);
            break;
        case TP_OPTIM_ADAGRAD:
            adagrad_f32(&c, n, p, g, b[0]);
            break;
        case TP_OPTIM_ADAM:
        case TP_OPTIM_ADAMW:
            adam_f32(&c, n, p, g, b[0], b[1], b[2]);
            break;
        case TP_OPTIM_RMSPROP:
            rmsprop_f32(&c, n, p, g, b[0], b[1], b[2]);
            break;
        }
        return;
    }
    switch (o->kind) {
    case TP_OPTIM_SGD:
        sgd_f64(&c, n, p, g, b[0]);
        break;
    case TP_OPTIM_ADAGRAD:
        adagrad_f64(&c, n, p, g, b[0]);
        break;
    case TP_OPTIM_ADAM:
    case TP_OPTIM_ADAMW:
        adam_f64(&c, n, p, g, b[0], b[1], b[2]);
        break;
    case TP_OPTIM_RMSPROP:
        rmsprop_f64(&c, n, p, g, b[0], b[1], b[2]);
        break;
    }
}
