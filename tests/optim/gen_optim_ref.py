#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""gen_optim_ref.py - reference data for tests/optim/optim_test.c, made by
PyTorch 1.13's torch.optim (single-tensor implementations: foreach=False).

Rerun (the distribution's Python, which has python3-torch; a pyenv
`python3` on PATH may lack torch), from the repository root:

    /usr/bin/python3 tests/optim/gen_optim_ref.py tests/optim/optim_ref.h

What it computes (docs/optim.md, "Reference data"): three parameters, A of
shape [2, 3], B of shape [4] and C of shape [37], start at A0, B0 and C0
(C is long enough for ATen's vectorised loops, A and B are not). At step t = 1..20 the
gradient of each is G[t] + 0.5 * p (G: fixed numbers stored in the
header, p: the parameter before the step), except that B has no gradient
at the steps t % 3 == 0 (p.grad = None: PyTorch skips it and its state
does not advance). Each case (an optimizer and its options) runs these 20
steps once in float64 and once in float32; the header keeps A and B
after every step of the float64 run, and the rest after the last step (a
smaller header). It also keeps each optimizer's defaults as
PyTorch reports them (optimizer.defaults), which the test compares with
tp_optim_options_init.
"""

import math
import subprocess
import sys

import torch

STEPS = 20
A0 = [0.5, -1.25, 2.0, -0.75, 1.5, -2.5]
B0 = [0.3, -0.8, 1.1, -1.9]
# C's start and gradients are small dyadic fractions, exact in f32 and f64,
# which the test computes with the same formulas (REF_C0, REF_GC) instead
# of reading them from the header.
NC = 37
C0 = [((5 * i) % 13 - 6) / 4 for i in range(NC)]
SHAPE_A = (2, 3)
# B has no gradient at these steps.
B_SKIP = [t for t in range(1, STEPS + 1) if t % 3 == 0]

# Fields of tp_optim_options, in the header's order.
FIELDS = ["lr", "weight_decay", "momentum", "dampening", "nesterov",
          "beta1", "beta2", "eps", "amsgrad", "lr_decay",
          "initial_accumulator_value", "alpha", "centered", "maximize"]
BOOLS = {"nesterov", "amsgrad", "centered", "maximize"}

KINDS = {
    "sgd": ("TP_OPTIM_SGD", torch.optim.SGD,
            ["lr", "momentum", "dampening", "weight_decay", "nesterov",
             "maximize"]),
    "adagrad": ("TP_OPTIM_ADAGRAD", torch.optim.Adagrad,
                ["lr", "lr_decay", "weight_decay",
                 "initial_accumulator_value", "eps", "maximize"]),
    "adam": ("TP_OPTIM_ADAM", torch.optim.Adam,
             ["lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"]),
    "adamw": ("TP_OPTIM_ADAMW", torch.optim.AdamW,
              ["lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"]),
    "rmsprop": ("TP_OPTIM_RMSPROP", torch.optim.RMSprop,
                ["lr", "alpha", "eps", "weight_decay", "momentum",
                 "centered", "maximize"]),
}


def c_defaults(kind):
    """What tp_optim_options_init sets (optim/options.c)."""
    d = {f: 0.0 for f in FIELDS}
    for f in BOOLS:
        d[f] = False
    d.update(beta1=0.9, beta2=0.999, alpha=0.99)
    d.update({
        "sgd": dict(lr=math.nan, eps=1e-8),
        "adagrad": dict(lr=1e-2, eps=1e-10),
        "adam": dict(lr=1e-3, eps=1e-8),
        "adamw": dict(lr=1e-3, eps=1e-8, weight_decay=1e-2),
        "rmsprop": dict(lr=1e-2, eps=1e-8),
    }[kind])
    return d


# (name, kind, options that differ from c_defaults)
CASES = [
    ("sgd_plain", "sgd", dict(lr=0.1)),
    ("sgd_momentum", "sgd", dict(lr=0.05, momentum=0.9)),
    ("sgd_nesterov", "sgd", dict(lr=0.05, momentum=0.9, nesterov=True)),
    ("sgd_dampening_wd", "sgd",
     dict(lr=0.05, momentum=0.8, dampening=0.3, weight_decay=0.01)),
    ("sgd_maximize", "sgd", dict(lr=0.02, momentum=0.5, maximize=True)),
    ("adagrad", "adagrad", dict(lr=0.1)),
    ("adagrad_decay_wd", "adagrad",
     dict(lr=0.1, lr_decay=0.05, weight_decay=0.05,
          initial_accumulator_value=0.1)),
    ("adam", "adam", dict(lr=0.01)),
    ("adam_wd_betas", "adam",
     dict(lr=0.02, weight_decay=0.1, beta1=0.8, beta2=0.99, eps=1e-6)),
    ("adam_amsgrad", "adam", dict(lr=0.01, amsgrad=True)),
    ("adam_maximize", "adam", dict(lr=0.01, maximize=True)),
    ("adamw", "adamw", dict(lr=0.01, weight_decay=0.1)),
    ("adamw_amsgrad", "adamw", dict(lr=0.01, weight_decay=0.05, amsgrad=True)),
    ("rmsprop", "rmsprop", dict(lr=0.01)),
    ("rmsprop_centered_momentum", "rmsprop",
     dict(lr=0.01, momentum=0.9, centered=True, alpha=0.9,
          weight_decay=0.01)),
]


def grads(n, phase):
    """G[t][i] for t = 1..STEPS: smooth, sign-changing, deterministic."""
    return [[math.sin(1.3 * i + 0.7 * t + phase) * (1 + 0.05 * t)
             for i in range(n)] for t in range(1, STEPS + 1)]


GA = grads(len(A0), 0.0)
GB = grads(len(B0), 0.4)
GC = [[((7 * i + 3 * t) % 17 - 8) / 8 for i in range(NC)]
      for t in range(1, STEPS + 1)]


def torch_kwargs(kind, opts):
    kw = {}
    for k in KINDS[kind][2]:
        if k == "betas":
            kw[k] = (opts["beta1"], opts["beta2"])
        else:
            kw[k] = opts[k]
    return kw


def run(kind, opts, dtype):
    a = torch.tensor(A0, dtype=torch.float64).reshape(SHAPE_A).to(dtype)
    b = torch.tensor(B0, dtype=torch.float64).to(dtype)
    c = torch.tensor(C0, dtype=torch.float64).to(dtype)
    for p in (a, b, c):
        p.requires_grad_()
    opt = KINDS[kind][1]([a, b, c], foreach=False,
                         **torch_kwargs(kind, opts))
    ha, hb, hc = [], [], []
    for t in range(1, STEPS + 1):
        ga = torch.tensor(GA[t - 1], dtype=torch.float64).to(dtype)
        gb = torch.tensor(GB[t - 1], dtype=torch.float64).to(dtype)
        gc = torch.tensor(GC[t - 1], dtype=torch.float64).to(dtype)
        with torch.no_grad():
            a.grad = ga.reshape(SHAPE_A) + 0.5 * a
            b.grad = None if t in B_SKIP else gb + 0.5 * b
            c.grad = gc + 0.5 * c
        opt.step()
        ha.append(a.detach().double().flatten().tolist())
        hb.append(b.detach().double().flatten().tolist())
        hc.append(c.detach().double().flatten().tolist())
    return ha, hb, hc


def torch_defaults(kind):
    """optimizer.defaults of @kind, as (field, value) in our names."""
    p = torch.zeros(1, requires_grad=True)
    cls = KINDS[kind][1]
    # SGD's lr is `required`: it has no default (NaN in tp_optim_options).
    opt = cls([p], lr=0.5) if kind == "sgd" else cls([p])
    out = []
    for k in KINDS[kind][2]:
        v = opt.defaults[k]
        if k == "betas":
            out += [("beta1", v[0]), ("beta2", v[1])]
        elif k == "lr" and kind == "sgd":
            out.append(("lr", math.nan))
        else:
            out.append((k, v))
    return out


def num(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if math.isnan(v):
        return "NAN"
    return repr(float(v))


def rows(hist):
    return "{" + ", ".join("{" + ", ".join(num(x) for x in r) + "}"
                           for r in hist) + "}"


def main():
    out = open(sys.argv[1], "w") if len(sys.argv) > 1 else sys.stdout
    w = out.write
    w("/* SPDX-License-Identifier: Apache-2.0 */\n")
    w("/* optim_ref.h - made by tests/optim/gen_optim_ref.py with PyTorch\n"
      " * %s: do not edit. Rerun from the repository root:\n"
      " *   /usr/bin/python3 tests/optim/gen_optim_ref.py "
      "tests/optim/optim_ref.h\n */\n" % torch.__version__)
    w("#ifndef TP_TESTS_OPTIM_REF_H\n#define TP_TESTS_OPTIM_REF_H\n\n")
    w("#include <math.h>\n#include <stdbool.h>\n\n#include <tpipe/optim.h>\n\n")
    w("#define REF_STEPS %d\n#define REF_NA %d\n#define REF_NB %d\n"
      "#define REF_NC %d\n" % (STEPS, len(A0), len(B0), len(C0)))
    w("#define REF_B_SKIP(t) ((t) % 3 == 0) /* B has no gradient */\n\n")
    w("static const int64_t ref_shape_a[2] = {%d, %d};\n" % SHAPE_A)
    w("static const double ref_a0[REF_NA] = {%s};\n"
      % ", ".join(num(x) for x in A0))
    w("static const double ref_b0[REF_NB] = {%s};\n"
      % ", ".join(num(x) for x in B0))
    w("#define REF_C0(i) ((double)((5 * (i)) % 13 - 6) / 4)\n")
    w("/* G[t - 1]: the gradient at step t is G + 0.5 * p. */\n")
    w("static const double ref_ga[REF_STEPS][REF_NA] = %s;\n" % rows(GA))
    w("static const double ref_gb[REF_STEPS][REF_NB] = %s;\n" % rows(GB))
    w("#define REF_GC(t, i) ((double)((7 * (i) + 3 * (t)) % 17 - 8) / 8)\n\n")

    w("typedef struct ref_case {\n    const char *name;\n"
      "    tp_optim_kind kind;\n")
    for f in FIELDS:
        w("    %s %s;\n" % ("bool" if f in BOOLS else "double", f))
    w("    /* float64: A and B after each step, C after the last */\n"
      "    double a64[REF_STEPS][REF_NA], b64[REF_STEPS][REF_NB];\n"
      "    double c64[REF_NC];\n"
      "    /* float32: after the last step */\n"
      "    double a32[REF_NA], b32[REF_NB], c32[REF_NC];\n"
      "} ref_case;\n\n")
    w("static const ref_case ref_cases[] = {\n")
    for name, kind, extra in CASES:
        opts = c_defaults(kind)
        for k in extra:
            assert k in opts, k
        opts.update(extra)
        a64, b64, c64 = run(kind, opts, torch.float64)
        a32, b32, c32 = run(kind, opts, torch.float32)
        w("    {\n        .name = \"%s\",\n        .kind = %s,\n"
          % (name, KINDS[kind][0]))
        for f in FIELDS:
            w("        .%s = %s,\n" % (f, num(opts[f])))
        last = {"c64", "a32", "b32", "c32"}
        for lbl, h in (("a64", a64), ("b64", b64), ("c64", c64),
                       ("a32", a32), ("b32", b32), ("c32", c32)):
            w("        .%s = %s,\n"
              % (lbl, rows(h[-1:])[1:-1] if lbl in last else rows(h)))
        w("    },\n")
    w("};\n\n")

    w("/* PyTorch's defaults (optimizer.defaults) of the fields each kind "
      "has. */\ntypedef struct ref_default {\n    tp_optim_kind kind;\n"
      "    const char *field;\n    double value;\n} ref_default;\n\n")
    w("static const ref_default ref_defaults[] = {\n")
    for kind in KINDS:
        cd = c_defaults(kind)
        for f, v in torch_defaults(kind):
            # The mirror of tp_optim_options_init above must agree too.
            assert (math.isnan(v) and math.isnan(cd[f])) or cd[f] == v, \
                (kind, f, v, cd[f])
            w("    {%s, \"%s\", %s},\n"
              % (KINDS[kind][0], f, num(float(v))))
    w("};\n\n#endif\n")
    if out is not sys.stdout:
        out.close()
        # The header is checked in: give it the repository's format.
        subprocess.run(["clang-format", "-i", "--style=file", sys.argv[1]],
                       check=True)


if __name__ == "__main__":
    main()
