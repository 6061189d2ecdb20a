# SPDX-License-Identifier: Apache-2.0
"""The peer side of tp_bench_autograd: the same measurements with PyTorch
(and numpy for matmul) on this machine, with the same thread count.

Usage: OPENBLAS_NUM_THREADS=N /usr/bin/python3 peer_torch.py [N]
Run tp_bench_autograd with the same OPENBLAS_NUM_THREADS.
"""
import os
import sys
import time

import numpy as np
import torch

threads = int(sys.argv[1]) if len(sys.argv) > 1 else int(
    os.environ.get("OPENBLAS_NUM_THREADS", "1"))
torch.set_num_threads(threads)
torch.manual_seed(1)
print(f"torch {torch.__version__} numpy {np.__version__} "
      f"threads {torch.get_num_threads()} "
      f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')}")


def best(fn, reps):
    fn()  # warm up
    t = 1e30
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        t = min(t, time.perf_counter() - t0)
    return t


n = 1024
a = torch.rand(n, n) * 2 - 1
b = torch.rand(n, n) * 2 - 1
t = best(lambda: torch.mm(a, b), 5)
print(f"torch matmul {n}x{n} f32: {2 * n ** 3 / t / 1e9:.1f} GFLOP/s")
an, bn = a.numpy(), b.numpy()
t = best(lambda: an @ bn, 5)
print(f"numpy matmul {n}x{n} f32: {2 * n ** 3 / t / 1e9:.1f} GFLOP/s")

for elems in (1 << 22, 1 << 24):
    x = torch.rand(elems)
    y = torch.rand(elems)
    out = torch.empty(elems)
    nbytes = elems * 4
    t = best(lambda: torch.add(x, y), 10)
    t_out = best(lambda: torch.add(x, y, out=out), 10)
    t_cpy = best(lambda: out.copy_(x), 10)
    print(f"torch add f32 {elems} elems: {3 * nbytes / t / 1e9:.2f} GB/s "
          f"(new result), {3 * nbytes / t_out / 1e9:.2f} GB/s (out=); "
          f"copy_ {2 * nbytes / t_cpy / 1e9:.2f} GB/s")

batch, nin, hid, nout = 256, 784, 512, 10
x = torch.rand(batch, nin)
y = torch.arange(batch) % nout
w1 = ((torch.rand(nin, hid) - 0.5) * 0.1).requires_grad_()
b1 = ((torch.rand(hid) - 0.5) * 0.1).requires_grad_()
w2 = ((torch.rand(hid, nout) - 0.5) * 0.1).requires_grad_()
b2 = ((torch.rand(nout) - 0.5) * 0.1).requires_grad_()
params = [w1, b1, w2, b2]


def step():
    h = torch.relu(x @ w1 + b1)
    o = h @ w2 + b2
    loss = torch.nn.functional.cross_entropy(o, y)
    loss.backward()
    with torch.no_grad():
        for p in params:
            p.add_(p.grad, alpha=-0.1)
            p.grad = None


for _ in range(2):
    step()
steps = 20
t0 = time.perf_counter()
for _ in range(steps):
    step()
per = (time.perf_counter() - t0) / steps
print(f"torch mlp 784-512-10 batch 256 step (fwd+bwd+sgd): {per * 1e3:.2f} ms")
