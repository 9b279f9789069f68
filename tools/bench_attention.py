#!/usr/bin/env python3
"""One layer's causal self-attention, forward and backward: crew's (bench/bench_attention, through
the CPU backend's attention ops) against PyTorch's, measured in the same run on the same core.

    python3 tools/bench_attention.py [--bench build/bench/bench_attention] [--batch 16]
                                     [--context 128] [--heads 4] [--head-dim 32] [--rounds 5]
                                     [--markdown]

The defaults are one replica's share of a gpt_tiny step. PyTorch runs the attention bench_gpt.py's
model runs (F.scaled_dot_product_attention with is_causal, its fused CPU kernel) and the same
written out as tools/gpt_reference.py has it (q·kᵀ/√d, the causal mask, softmax, ·v), both with
autograd's backward to q, k and v from a given dy; crew's backward also writes d att (its
activations are kept from forward, as a transformer block keeps them), PyTorch's keeps what autograd
keeps. Each is timed as bench_attention times crew: rounds of 10 calls, the fastest call of a round,
the median of the rounds; crew, then PyTorch, in alternating rounds, one thread each.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import bench_compare  # noqa: E402  (pick_cores, describe_cores)


def torch_times(torch, a, fused):
    """(forward, backward) seconds of one call, the fastest of 10, of PyTorch's attention."""
    F = torch.nn.functional
    B, T, H, d = a.batch, a.context, a.heads, a.head_dim
    qkv = torch.rand(B, T, 3, H, d) * 2 - 1
    q, k, v = (qkv[:, :, i].transpose(1, 2).contiguous().requires_grad_() for i in range(3))  # [B, H, T, d]
    dy = torch.rand(B, H, T, d) * 2 - 1
    mask = torch.ones(T, T, dtype=torch.bool).tril()

    def forward():
        if fused:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        s = (q @ k.transpose(-2, -1)) * (1.0 / d ** 0.5)
        return torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1) @ v

    best_f = best_b = float("inf")
    for _ in range(10):
        t0 = time.perf_counter()
        y = forward()
        t1 = time.perf_counter()
        y.backward(dy)
        t2 = time.perf_counter()
        q.grad = k.grad = v.grad = None
        best_f, best_b = min(best_f, t1 - t0), min(best_b, t2 - t1)
    return best_f, best_b


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bench", default=os.path.join(ROOT, "build", "bench", "bench_attention"))
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--markdown", action="store_true")
    a = p.parse_args()
    if not os.path.exists(a.bench):
        sys.exit(f"bench_attention: {a.bench} is not built (make build)")
    try:
        import torch
    except ImportError:
        sys.exit("bench_attention: PyTorch is not installed (pip install torch): it is the peer")
    cores = bench_compare.pick_cores(1)
    cmd = ["taskset", "-c", str(cores[0]), a.bench, "--batch", str(a.batch), "--context", str(a.context),
           "--heads", str(a.heads), "--head-dim", str(a.head_dim), "--rounds", "1", "--json"]
    os.sched_setaffinity(0, cores)
    torch.set_num_threads(1)
    runs = {"crew": [], "PyTorch fused (SDPA)": [], "PyTorch written out": []}
    for _ in range(a.rounds):
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        j = json.loads(out.strip().splitlines()[-1])
        runs["crew"].append((j["forward_ms"] / 1e3, j["backward_ms"] / 1e3))
        runs["PyTorch fused (SDPA)"].append(torch_times(torch, a, True))
        runs["PyTorch written out"].append(torch_times(torch, a, False))
    flop_f = 2.0 * a.head_dim * a.context * (a.context + 1) * a.batch * a.heads
    print(f"one layer's causal attention: {a.batch} windows of T {a.context}, {a.heads} heads of {a.head_dim}; "
          f"one thread on {bench_compare.describe_cores(cores)}; torch {torch.__version__}; median of {a.rounds} "
          f"alternating rounds, each the fastest of 10 calls\n")
    head = ["contestant", "forward ms", "backward ms", "both ms", "GFLOP/s (causal half)", "crew faster by"]
    med = {n: (statistics.median(f for f, _ in r), statistics.median(b for _, b in r)) for n, r in runs.items()}
    crew_both = sum(med["crew"])
    rows = []
    for n, (f, b) in med.items():
        rows.append([n, f"{1e3 * f:.3f}", f"{1e3 * b:.3f}", f"{1e3 * (f + b):.3f}", f"{3 * flop_f / (f + b) / 1e9:.1f}",
                     "" if n == "crew" else f"{(f + b) / crew_both:.2f}x"])
    if a.markdown:
        print("| " + " | ".join(head) + " |")
        print("|---|" + "|".join(["--:"] * (len(head) - 1)) + "|")
        for r in rows:
            print("| " + " | ".join(r) + " |")
    else:
        print("  ".join(f"{h:>22}" for h in head))
        for r in rows:
            print("  ".join(f"{c:>22}" for c in r))
    print("\nrounds, PyTorch's best over crew's (forward + backward): " + ", ".join(
        f"{min(sum(runs['PyTorch fused (SDPA)'][i]), sum(runs['PyTorch written out'][i])) / sum(runs['crew'][i]):.2f}"
        for i in range(a.rounds)))


if __name__ == "__main__":
    main()
