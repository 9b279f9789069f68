#!/usr/bin/env python3
"""Writes tests/fixtures/reference/lamb_lars.safetensors: LAMB's and LARS's trajectories on given
gradients, computed here in float64 from the papers' formulas, which tests/test_reference_lamb_lars.c
replays through crew's optimizer.

Run from anywhere:  python3 tools/make_lamb_lars_reference.py      (needs numpy only)

Written from the papers, not from crew's code:
  LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning", algorithm 2), per tensor:
      m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;  m^ = m / (1 - b1^t);  v^ = v / (1 - b2^t)
      u = m^ / (sqrt(v^) + eps) + wd w;  r = |w| / |u| (1 when either is 0);  w = w - lr r u
  LARS (You et al. 2017, "Large Batch Training of Convolutional Networks"), in the form of NVIDIA
  apex's LARC (clip=False) over PyTorch's SGD, per tensor:
      d = g + wd w;  r = trust |w| / (|g| + wd |w| + eps) (1 when |w| or |g| is 0);  d = r d
      v = mu v + d;  step = nesterov ? d + mu v : v;  w = w - lr step
The gradients are fixed in advance (not computed from a loss), three tensors of different sizes
and scales (a norm that is 0 for one of them at the start), 30 steps at a warmup-then-decay rate.
For each configuration <c>: <c>/p0 [N] the starting parameters (three tensors, back to back),
<c>/grads [STEPS, N], <c>/lr [STEPS], <c>/p [N] after the last step; metadata "bounds" gives the
tensors' bounds and "<c>" the hyperparameters.
"""
import json
import os
import struct

import numpy as np

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
OUT = os.path.join(ROOT, "tests", "fixtures", "reference", "lamb_lars.safetensors")

SIZES = [96, 33, 7]
BOUNDS = [0, 96, 129, 136]
STEPS = 30
CONFIGS = {  # name: (kind, hyperparameters)
    "lamb": ("lamb", {"beta1": 0.9, "beta2": 0.999, "eps": 1e-6, "weight_decay": 0.01, "lr": 0.01}),
    "lamb_nowd": ("lamb", {"beta1": 0.8, "beta2": 0.99, "eps": 1e-6, "weight_decay": 0.0, "lr": 0.02}),
    "lars": ("lars", {"momentum": 0.9, "nesterov": 0, "trust": 0.001, "eps": 0.0, "weight_decay": 5e-4, "lr": 2.0}),
    "lars_nesterov": ("lars", {"momentum": 0.9, "nesterov": 1, "trust": 0.02, "eps": 1e-8, "weight_decay": 0.0,
                               "lr": 0.5}),
}


def lr_schedule(peak):
    t = np.arange(STEPS)
    lr = np.where(t < 5, peak * (t + 1) / 5, peak * (0.2 + 0.8 * np.cos(np.pi * (t - 5) / (2 * STEPS))))
    return lr.astype(np.float32)


def start(rng):
    p = np.concatenate([rng.standard_normal(96) * 0.5, rng.standard_normal(33) * 0.01, np.zeros(7)])
    return p.astype(np.float32)


def gradients(rng):
    scale = np.concatenate([np.full(96, 1e-2), np.full(33, 3.0), np.full(7, 1e-4)])
    g = rng.standard_normal((STEPS, 136)) * scale
    g[:, 40:44] = 0.0  # parameters without a gradient
    return g.astype(np.float32)


def lamb(p, grads, lr, h):
    w = p.astype(np.float64).copy()
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    for t in range(1, STEPS + 1):
        g = grads[t - 1].astype(np.float64)
        m = h["beta1"] * m + (1 - h["beta1"]) * g
        v = h["beta2"] * v + (1 - h["beta2"]) * g * g
        u = (m / (1 - h["beta1"] ** t)) / (np.sqrt(v / (1 - h["beta2"] ** t)) + h["eps"]) + h["weight_decay"] * w
        for a, b in zip(BOUNDS, BOUNDS[1:]):
            wn, un = np.linalg.norm(w[a:b]), np.linalg.norm(u[a:b])
            r = wn / un if wn > 0 and un > 0 else 1.0
            w[a:b] -= float(lr[t - 1]) * r * u[a:b]
    return w


def lars(p, grads, lr, h):
    w = p.astype(np.float64).copy()
    vel = np.zeros_like(w)
    for t in range(STEPS):
        g = grads[t].astype(np.float64)
        for a, b in zip(BOUNDS, BOUNDS[1:]):
            wn, gn = np.linalg.norm(w[a:b]), np.linalg.norm(g[a:b])
            r = h["trust"] * wn / (gn + h["weight_decay"] * wn + h["eps"]) if wn > 0 and gn > 0 else 1.0
            d = r * (g[a:b] + h["weight_decay"] * w[a:b])
            vel[a:b] = h["momentum"] * vel[a:b] + d
            step = d + h["momentum"] * vel[a:b] if h["nesterov"] else vel[a:b]
            w[a:b] -= float(lr[t]) * step
    return w


def write_safetensors(path, tensors, metadata):
    """The safetensors layout (a little-endian u64 header length, the JSON header, the data)."""
    header, blobs, at = {"__metadata__": metadata}, [], 0
    for name, a in tensors.items():
        raw = np.ascontiguousarray(a, dtype=np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def main():
    rng = np.random.default_rng(20261204)
    tensors, metadata = {}, {"bounds": ",".join(map(str, BOUNDS))}
    for name, (kind, h) in CONFIGS.items():
        p0, grads, lr = start(rng), gradients(rng), lr_schedule(h["lr"])
        p = (lamb if kind == "lamb" else lars)(p0, grads, lr, h)
        tensors.update({f"{name}/p0": p0, f"{name}/grads": grads, f"{name}/lr": lr, f"{name}/p": p})
        metadata[name] = json.dumps({"kind": kind, **h})
        moved = np.abs(p - p0).max()
        print(f"{name}: moved up to {moved:.3g}, |p| up to {np.abs(p).max():.3g}")
    write_safetensors(OUT, tensors, metadata)
    print("wrote", OUT)


if __name__ == "__main__":
    main()
