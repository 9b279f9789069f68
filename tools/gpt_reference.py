#!/usr/bin/env python3
"""Writes the GPT-2 reference fixture that crew's GPT is checked against, in the spirit of
llm.c's train_gpt2.py reference test.

    python3 tools/gpt_reference.py --out tests/fixtures/gpt_ref

Needs torch, numpy and safetensors (pip install torch numpy safetensors). The C build and tests
never need them: they only read the files written here. The output is deterministic (fixed
seed, CPU, float32, one thread, deterministic algorithms), so rerunning rewrites the same files.

The network is GPT-2 exactly (no dropout, LM head tied to the token embedding), with its
parameters kept as plain tensors in crew's names and layouts (kernels [in, out], the transpose
of nn.Linear.weight), so the gradients autograd returns are already in crew's layouts. Files:
  model.json              crew's model file for the same configuration
  weights.safetensors     the initial parameters, loadable by crew_model_load_weights
  expected.safetensors    x, y [B, T] (ids as floats); logits [B, T, V] and loss [1] at step 0;
                          grad.<param> at step 0; losses [10], the loss before each of 10 AdamW
                          steps on the same batch; final.<param> after those steps
A second forward pass in plain float64 NumPy checks torch's loss and logits before anything is
written.
"""
import argparse
import math
import os

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.numpy import load_file, save_file

L, H, C, T, V, B = 2, 4, 32, 16, 64, 4  # layers, heads, width, context, vocab, batch
LR, BETAS, EPS, WEIGHT_DECAY = 1e-3, (0.9, 0.999), 1e-8, 0.1
STEPS = 10
SEED = 20250101
LN_EPS = 1e-5


def num(v):
    """A float as the model file spells it: 0.001, 1e-8 (not Python's 1e-08)."""
    return repr(v).replace("e-0", "e-")


# crew's model file for this configuration (docs/MODEL_FILES.md, "gpt").
MODEL_JSON = f"""{{
  "name": "gpt_ref",
  "layers": [{{"type": "gpt", "layers": {L}, "heads": {H}, "width": {C}, "context": {T}, "vocab": {V}}}],
  "loss": "softmax_cross_entropy",
  "optimizer": {{"type": "adamw", "lr": {num(LR)}, "base_batch": {B}, "lr_scaling": "none", "beta1": {num(BETAS[0])}, "beta2": {num(BETAS[1])}, "eps": {num(EPS)}, "weight_decay": {num(WEIGHT_DECAY)}, "clip_norm": 0, "schedule": {{"type": "constant", "warmup_steps": 0}}}},
  "training": {{"epochs": 1, "batch_per_device": {B}, "seed": 1}}
}}
"""

BLOCK_PARAMS = ["ln1_gamma", "ln1_beta", "attn_kernel", "attn_bias", "attn_proj_kernel", "attn_proj_bias",
                "ln2_gamma", "ln2_beta", "mlp_kernel", "mlp_bias", "mlp_proj_kernel", "mlp_proj_bias"]


def param_specs():
    """[(crew name, shape, init kind, std)] in crew's layer order (the order crew lists them)."""
    proj_std = 0.02 / math.sqrt(2 * L)  # GPT-2's scaled init of the residual projections
    shapes = {"ln1_gamma": [C], "ln1_beta": [C], "attn_kernel": [C, 3 * C], "attn_bias": [3 * C],
              "attn_proj_kernel": [C, C], "attn_proj_bias": [C], "ln2_gamma": [C], "ln2_beta": [C],
              "mlp_kernel": [C, 4 * C], "mlp_bias": [4 * C], "mlp_proj_kernel": [4 * C, C], "mlp_proj_bias": [C]}
    specs = [("gpt_embedding.wte", [V, C], "normal", 0.02), ("gpt_embedding.wpe", [T, C], "normal", 0.02)]
    for i in range(L):
        for p in BLOCK_PARAMS:
            if p.endswith("gamma"):
                kind, std = "gamma", 0.1  # 1 + N(0, 0.1²): not 1, so gamma's role is tested
            elif p.endswith("beta"):
                kind, std = "normal", 0.1
            elif p in ("attn_proj_kernel", "mlp_proj_kernel"):
                kind, std = "normal", proj_std
            else:
                kind, std = "normal", 0.02  # kernels, and biases too: nonzero so their gradients matter
            specs.append((f"block_{i}.{p}", shapes[p], kind, std))
    specs += [("ln_f.gamma", [C], "gamma", 0.1), ("ln_f.beta", [C], "normal", 0.1)]
    return specs


def init_params(gen):
    params = {}
    for name, shape, kind, std in param_specs():
        t = torch.randn(shape, generator=gen, dtype=torch.float32) * std
        if kind == "gamma":
            t += 1.0
        params[name] = t.requires_grad_(True)
    return params


# ------------------------------------------------------------------ the model in torch (float32)

def forward(P, x):
    """logits [B, T, V] for token ids x [B, T] (int64)."""
    b, t = x.shape
    hs = C // H
    h = P["gpt_embedding.wte"][x] + P["gpt_embedding.wpe"][:t]
    causal = torch.tril(torch.ones(t, t, dtype=torch.bool))
    for i in range(L):
        p = lambda n: P[f"block_{i}.{n}"]  # noqa: E731
        a = F.layer_norm(h, (C,), p("ln1_gamma"), p("ln1_beta"), LN_EPS)
        qkv = a @ p("attn_kernel") + p("attn_bias")                      # [B, T, 3C]
        q, k, v = (z.view(b, t, H, hs).transpose(1, 2) for z in qkv.split(C, dim=-1))  # [B, H, T, hs]
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, C)                   # heads side by side
        h = h + y @ p("attn_proj_kernel") + p("attn_proj_bias")
        m = F.layer_norm(h, (C,), p("ln2_gamma"), p("ln2_beta"), LN_EPS)
        m = F.gelu(m @ p("mlp_kernel") + p("mlp_bias"), approximate="tanh")
        h = h + m @ p("mlp_proj_kernel") + p("mlp_proj_bias")
    h = F.layer_norm(h, (C,), P["ln_f.gamma"], P["ln_f.beta"], LN_EPS)
    return h @ P["gpt_embedding.wte"].t()                              # tied LM head


def loss_of(logits, y):
    return F.cross_entropy(logits.reshape(-1, V), y.reshape(-1))       # mean over B·T positions


# ------------------------------------------------------------------ an independent check in float64 NumPy

def numpy_forward(W, x, y):
    """(logits, loss) in float64 from weights W (numpy), written without torch."""
    W = {k: v.astype(np.float64) for k, v in W.items()}
    hs = C // H

    def layer_norm(z, g, b):
        mu = z.mean(-1, keepdims=True)
        var = ((z - mu) ** 2).mean(-1, keepdims=True)
        return (z - mu) / np.sqrt(var + LN_EPS) * g + b

    def gelu(z):
        return 0.5 * z * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (z + 0.044715 * z ** 3)))

    h = W["gpt_embedding.wte"][x] + W["gpt_embedding.wpe"][None, :x.shape[1]]
    t = x.shape[1]
    future = np.triu(np.ones((t, t), dtype=bool), 1)
    for i in range(L):
        w = lambda n: W[f"block_{i}.{n}"]  # noqa: E731
        a = layer_norm(h, w("ln1_gamma"), w("ln1_beta"))
        qkv = a @ w("attn_kernel") + w("attn_bias")
        out = np.empty_like(h)
        for hd in range(H):  # one head at a time, columns hd*hs..(hd+1)*hs of q, k and v
            cols = slice(hd * hs, (hd + 1) * hs)
            q, k, v = qkv[..., :C][..., cols], qkv[..., C:2 * C][..., cols], qkv[..., 2 * C:][..., cols]
            s = np.einsum("btd,bsd->bts", q, k) / np.sqrt(hs)
            s[:, future] = -np.inf
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            out[..., cols] = np.einsum("bts,bsd->btd", s, v)
        h = h + out @ w("attn_proj_kernel") + w("attn_proj_bias")
        m = layer_norm(h, w("ln2_gamma"), w("ln2_beta"))
        h = h + gelu(m @ w("mlp_kernel") + w("mlp_bias")) @ w("mlp_proj_kernel") + w("mlp_proj_bias")
    logits = layer_norm(h, W["ln_f.gamma"], W["ln_f.beta"]) @ W["gpt_embedding.wte"].T
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    loss = -np.take_along_axis(logp, y[..., None], -1).mean()
    return logits, loss


def check_gradients(W, grads, x, y, per_param=3, h=1e-4):
    """Central differences of the float64 NumPy loss at a few entries of every parameter (wte's
    included: it must hold both the embedding's and the LM head's share) against torch's grads."""
    rng = np.random.default_rng(SEED)
    worst = 0.0
    for name, g in grads.items():
        for flat in rng.choice(g.size, per_param, replace=False):
            idx = np.unravel_index(flat, g.shape)
            Wp = {k: v.astype(np.float64) for k, v in W.items()}
            Wm = {k: v.copy() for k, v in Wp.items()}
            Wp[name][idx] += h
            Wm[name][idx] -= h
            fd = (numpy_forward(Wp, x, y)[1] - numpy_forward(Wm, x, y)[1]) / (2 * h)
            err = abs(fd - g[idx]) / max(abs(fd), 1e-3)
            worst = max(worst, err)
            assert err < 1e-2, f"grad.{name}{list(idx)}: torch {g[idx]:.6e}, finite difference {fd:.6e}"
    print(f"gradients: {per_param} entries of each parameter match central differences (worst relative {worst:.1e})")


def to_numpy(params):
    return {k: np.ascontiguousarray(v.detach().numpy(), dtype=np.float32).copy() for k, v in params.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="tests/fixtures/gpt_ref", help="output folder (default %(default)s)")
    out = ap.parse_args().out
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    gen = torch.Generator().manual_seed(SEED)

    params = init_params(gen)
    init = to_numpy(params)
    seq = torch.randint(0, V, (B, T + 1), generator=gen)  # next-token targets: y is x shifted by one
    x, y = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()

    # Step 0: logits, loss and gradients (the tied wte collects both its uses).
    logits = forward(params, x)
    loss = loss_of(logits, y)
    loss.backward()
    grads = {k: np.ascontiguousarray(v.grad.numpy(), dtype=np.float32).copy() for k, v in params.items()}
    logits0 = logits.detach().numpy().copy()
    loss0 = loss.item()

    # The independent float64 forward must agree before anything is written.
    np_logits, np_loss = numpy_forward(init, x.numpy(), y.numpy())
    rel = abs(loss0 - np_loss) / abs(np_loss)
    assert rel < 1e-6, f"torch loss {loss0!r} vs numpy float64 {np_loss!r}: relative {rel:.2e}"
    err = np.abs(logits0 - np_logits).max()
    assert err < 1e-5 * max(1.0, np.abs(np_logits).max()), f"logits differ by {err:.2e}"
    print(f"step-0 loss {loss0:.8f} (numpy float64 {np_loss:.10f}, relative {rel:.1e}; logits within {err:.1e})")
    check_gradients(init, grads, x.numpy(), y.numpy())

    # 10 AdamW steps on the same batch, decay on every parameter, one group, no clipping.
    opt = torch.optim.AdamW(list(params.values()), lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY,
                            foreach=False)
    losses = []
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss = loss_of(forward(params, x), y)
        losses.append(loss.item())
        loss.backward()
        opt.step()
    assert losses[0] == loss0, "step 0 of the training loop is not the recorded step 0"
    final = to_numpy(params)

    expected = {"x": x.numpy().astype(np.float32), "y": y.numpy().astype(np.float32),
                "logits": logits0, "loss": np.array([loss0], dtype=np.float32),
                "losses": np.array(losses, dtype=np.float32)}
    expected.update({f"grad.{k}": v for k, v in grads.items()})
    expected.update({f"final.{k}": v for k, v in final.items()})

    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "model.json"), "w") as f:
        f.write(MODEL_JSON)
    # crew_model_load_weights wants exactly one F32 tensor per parameter, nothing else, and ignores
    # metadata. One metadata key per file: safetensors writes several in a random (hash) order,
    # which would make the bytes differ from run to run.
    save_file(init, os.path.join(out, "weights.safetensors"), metadata={"format": "crew"})
    save_file(expected, os.path.join(out, "expected.safetensors"),
              metadata={"source": f"tools/gpt_reference.py, torch {torch.__version__}"})

    # Read back what was written, and show it.
    back = load_file(os.path.join(out, "weights.safetensors"))
    assert set(back) == set(init)
    assert all(np.array_equal(back[k], init[k]) for k in init)
    for fname in ("weights.safetensors", "expected.safetensors"):
        path = os.path.join(out, fname)
        print(f"{path} ({os.path.getsize(path)} bytes)")
        for k, v in load_file(path).items():
            print(f"  {k:32s} {str(list(v.shape)):14s} {v.dtype}")
    print("losses", " ".join(f"{v:.6f}" for v in losses))


if __name__ == "__main__":
    main()
