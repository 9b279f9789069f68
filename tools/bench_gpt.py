#!/usr/bin/env python3
"""gpt_tiny's training tokens/s on this machine: crew against PyTorch (eager and torch.compile),
side by side in one run.

    python3 tools/bench_gpt.py [--crew build/crew] [--text FILE] [--steps 40] [--warmup 8]

The model is examples/gpt_tiny.json (4 blocks, 4 heads, width 128, context 128, vocabulary 256,
tied LM head, tanh GELU), global batch 32 windows of 128 byte tokens, AdamW (lr 2e-3, betas
0.9/0.99, weight decay 0.1 on every parameter), gradient clipping at 1.0: the same on both sides.
Each contestant runs --warmup steps, then --steps timed steps; the figure is the median step time
(crew's from its metrics.jsonl step lines, which exclude start-up and evaluation).

  crew  --devices cpu:2                        2 replicas x 1 OpenBLAS thread, 16 windows each
  crew  --devices cpu:1 --threads-per-device 2 1 replica, 2 OpenBLAS threads
  crew  --devices cpu:1                        1 replica, 1 thread
  torch eager, torch.compile                   torch.set_num_threads(1) and (2)

Data: --text (default: the King James Bible from Debian's bible-kjv, as `make demo-gpt` makes it,
data/kjv.txt) prepared by crew prep text; PyTorch reads the same shard.
"""
import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "examples", "gpt_tiny.json")
GLOBAL_BATCH, CONTEXT = 32, 128


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--crew", default=os.path.join(ROOT, "build", "crew"))
    p.add_argument("--text", default=os.path.join(ROOT, "data", "kjv.txt"))
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--skip-compile", action="store_true", help="leave out torch.compile")
    return p.parse_args()


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def crew_run(args, data, tmp, name, flags):
    run_dir = os.path.join(tmp, name)
    cmd = [args.crew, "train", MODEL, "--data", data, "--run-dir", run_dir, "--quiet", "--global-batch",
           str(GLOBAL_BATCH), "--max-steps", str(args.warmup + args.steps)] + flags
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    times = []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if r.get("type") == "step" and r["step"] > args.warmup:
                times.append(r["step_s"])
    return statistics.median(times)


def torch_model(torch, vocab=256, width=128, layers=4, heads=4, context=CONTEXT):
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.attn, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
            self.fc, self.mlp_proj = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.attn(self.ln_1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, heads, C // heads).transpose(1, 2) for t in (q, k, v))
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).contiguous().view(B, T, C))
            return x + self.mlp_proj(torch.nn.functional.gelu(self.fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(context, width)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f = nn.LayerNorm(width)

        def forward(self, idx, targets):
            pos = torch.arange(idx.shape[1])
            x = self.wte(idx) + self.wpe(pos)
            for b in self.blocks:
                x = b(x)
            logits = self.ln_f(x) @ self.wte.weight.t()  # tied, as crew's lm_head
            return torch.nn.functional.cross_entropy(logits.view(-1, vocab), targets.view(-1))

    return GPT()


def torch_run(args, tokens, threads, compiled):
    import numpy as np
    import torch
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    model = torch_model(torch)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.9, 0.99), weight_decay=0.1)
    step_fn = torch.compile(model) if compiled else model
    rng = np.random.default_rng(1)
    n_windows = (len(tokens) - 1) // CONTEXT
    times = []
    for step in range(args.warmup + args.steps):
        w = rng.integers(0, n_windows, GLOBAL_BATCH) * CONTEXT
        x = torch.from_numpy(np.stack([tokens[i:i + CONTEXT] for i in w]).astype(np.int64))
        y = torch.from_numpy(np.stack([tokens[i + 1:i + CONTEXT + 1] for i in w]).astype(np.int64))
        t0 = time.perf_counter()
        loss = step_fn(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times), torch.__version__


def main():
    args = parse_args()
    import numpy as np
    if not os.path.exists(args.text):
        sys.exit(f"bench_gpt: {args.text} is missing (make demo-gpt writes it, or give --text FILE)")
    with tempfile.TemporaryDirectory(prefix="crew-bench-gpt-") as tmp:
        data = os.path.join(tmp, "data")
        subprocess.run([args.crew, "prep", "text", args.text, "--seq-len", str(CONTEXT), "--test-fraction", "0.01",
                        "--out", data], check=True, stdout=subprocess.DEVNULL)
        tokens = np.fromfile(os.path.join(data, "train_000000.bin"), dtype=np.uint16, offset=1024)
        rows = []  # (contestant, layout, step seconds)
        for name, layout, flags in [("crew", "2 replicas x 1 thread", ["--devices", "cpu:2"]),
                                    ("crew", "1 replica x 2 threads", ["--devices", "cpu:1", "--threads-per-device", "2"]),
                                    ("crew", "1 replica x 1 thread", ["--devices", "cpu:1"])]:
            rows.append((name, layout, crew_run(args, data, tmp, layout.replace(" ", "_"), flags)))
        version = "?"
        for compiled in ([False] if args.skip_compile else [False, True]):
            for threads in (2, 1):
                try:
                    s, version = torch_run(args, tokens, threads, compiled)
                    rows.append(("torch.compile" if compiled else "torch eager", f"{threads} threads", s))
                except Exception as e:  # torch.compile needs a C compiler and may fail: say so
                    print(f"bench_gpt: {'torch.compile' if compiled else 'torch'} at {threads} threads failed: {e}",
                          file=sys.stderr)
    tok = lambda s: GLOBAL_BATCH * CONTEXT / s
    best = lambda prefix: max((tok(s) for n, _, s in rows if n == prefix), default=float("nan"))
    crew_best, eager_best, compiled_best = best("crew"), best("torch eager"), best("torch.compile")
    print(f"gpt_tiny training, global batch {GLOBAL_BATCH} x {CONTEXT} tokens, median of {args.steps} steps "
          f"after {args.warmup}")
    print(f"machine: {cpu_model()}, {os.cpu_count()} CPUs; torch {version}; {datetime.date.today()}")
    print(f"{'contestant':<14} {'layout':<24} {'ms/step':>9} {'tokens/s':>10}")
    for n, layout, s in rows:
        print(f"{n:<14} {layout:<24} {1000 * s:>9.1f} {tok(s):>10.0f}")
    print(f"crew best / torch eager best: {crew_best / eager_best:.2f}x; "
          f"crew best / torch.compile best: {crew_best / compiled_best:.2f}x" if not math.isnan(compiled_best)
          else f"crew best / torch eager best: {crew_best / eager_best:.2f}x")


if __name__ == "__main__":
    main()
