#!/usr/bin/env python3
"""Writes tests/fixtures/reference/adamw.safetensors: torch.optim.AdamW's trajectory on given
gradients, which tests/test_reference_adamw.c replays through crew's optimizer.

Run from anywhere:  python3 tools/make_adamw_reference.py
Needs torch, numpy and safetensors. The C test only reads the file written here.

The gradients are fixed in advance (not computed from a loss), so the comparison isolates the
optimizer: both sides start from the same parameters, apply the same 60 gradients at the same
learning rates (a warmup then a cosine decay, as crew's plans do), and end with parameters and
moments that differ only by how each side rounds the update. For each configuration <c>:
  <c>/p0 [N] F32                 the starting parameters
  <c>/grads [STEPS, N] F32       the gradient of each step: mixed scales from 1e-6 to 10, some 0
  <c>/lr [STEPS] F32             the learning rate of each step
  <c>/p, <c>/m, <c>/v [N] F32    parameters, exp_avg and exp_avg_sq after the last step
  <c>/p_ieee_sqrt [N] F32        the parameters from torch's own update, op for op with torch's
                                 kernels (checked to give <c>/p exactly), but with a correctly
                                 rounded square root: torch's vector sqrt is not (1 ulp off for
                                 about a fifth of inputs on AVX-512), crew's sqrtf is
Metadata "<c>" holds "beta1,beta2,eps,weight_decay" as the Python floats torch used.
"""
import os

import numpy as np
import torch
from safetensors.numpy import save_file

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
OUT = os.path.join(ROOT, "tests", "fixtures", "reference", "adamw.safetensors")

N = 1024  # a multiple of every SIMD width, so torch's vector kernels cover every element
STEPS = 60
# name: (beta1, beta2, eps, weight_decay, peak lr). "default" is crew's and PyTorch's defaults.
CONFIGS = {
    "default": (0.9, 0.999, 1e-8, 0.01, 1e-3),
    "fast": (0.8, 0.95, 1e-6, 0.1, 3e-3),
}


def lr_schedule(peak):
    """Linear warmup over 10 steps, then cosine to a tenth: float32, as crew's plan computes it."""
    lr = np.empty(STEPS, dtype=np.float32)
    for t in range(STEPS):
        if t < 10:
            lr[t] = peak * (t + 1) / 10
        else:
            frac = (t - 10) / (STEPS - 10)
            lr[t] = peak * (0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * frac)))
    return lr


def gradients(rng):
    scale = 10.0 ** rng.uniform(-6, 1, size=(1, N))  # each parameter keeps its own scale
    g = rng.standard_normal((STEPS, N)) * scale
    g[:, rng.random(N) < 0.02] = 0.0  # parameters that never get a gradient (unused embedding rows)
    return g.astype(np.float32)


def by_hand(p0, grads, lr, beta1, beta2, eps, wd, sqrt):
    """torch.optim.AdamW's single-tensor update (torch/optim/adam.py, decoupled weight decay),
    written out with the same tensor ops, so that its square root can be swapped."""
    p = torch.from_numpy(p0.copy())
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    for t in range(STEPS):
        step, rate = t + 1, float(lr[t])
        g = torch.from_numpy(grads[t].copy())
        p.mul_(1 - rate * wd)
        m.lerp_(g, 1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        step_size = rate / (1 - beta1**step)
        c2_sqrt = (1 - beta2**step) ** 0.5
        denom = (sqrt(v) / c2_sqrt).add_(eps)
        p.addcdiv_(m, denom, value=-step_size)
    return p.numpy().copy()


def trajectory(name, beta1, beta2, eps, wd, peak, rng):
    p0 = (rng.standard_normal(N) * 0.1).astype(np.float32)
    grads = gradients(rng)
    lr = lr_schedule(peak)
    p = torch.nn.Parameter(torch.from_numpy(p0.copy()))
    opt = torch.optim.AdamW([p], lr=float(lr[0]), betas=(beta1, beta2), eps=eps, weight_decay=wd, foreach=False)
    for t in range(STEPS):
        for group in opt.param_groups:
            group["lr"] = float(lr[t])  # exactly the float32 value crew passes
        p.grad = torch.from_numpy(grads[t].copy())
        opt.step()
    state = opt.state[p]
    replay_torch = by_hand(p0, grads, lr, beta1, beta2, eps, wd, torch.sqrt)
    assert np.array_equal(replay_torch, p.detach().numpy()), "the hand-written update is not torch.optim.AdamW's"
    ieee = by_hand(p0, grads, lr, beta1, beta2, eps, wd, lambda t: torch.from_numpy(np.sqrt(t.numpy())))
    return {
        f"{name}/p_ieee_sqrt": ieee,
        f"{name}/p0": p0,
        f"{name}/grads": grads,
        f"{name}/lr": lr,
        f"{name}/p": p.detach().numpy().copy(),
        f"{name}/m": state["exp_avg"].numpy().copy(),
        f"{name}/v": state["exp_avg_sq"].numpy().copy(),
    }


def main():
    torch.set_num_threads(1)
    rng = np.random.default_rng(20261201)
    tensors, metadata = {}, {"torch": torch.__version__}
    for name, (b1, b2, eps, wd, peak) in CONFIGS.items():
        tensors.update(trajectory(name, b1, b2, eps, wd, peak, rng))
        metadata[name] = f"{b1!r},{b2!r},{eps!r},{wd!r}"
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    save_file(tensors, OUT, metadata=metadata)
    print(f"wrote {os.path.relpath(OUT, ROOT)} ({os.path.getsize(OUT)} bytes, torch {torch.__version__})")


if __name__ == "__main__":
    main()
