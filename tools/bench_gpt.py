#!/usr/bin/env python3
"""gpt_tiny's training tokens/s on this machine: crew against PyTorch (eager and torch.compile),
side by side in one run.

    python3 tools/bench_gpt.py [--crew build/crew] [--text FILE] [--steps 50] [--warmup 10]
                               [--rounds 1] [--skip-compile] [--idle 0.25] [--markdown] [--json]

The model is examples/gpt_tiny.json, read from the file on both sides (4 blocks, 4 heads, width
128, context 128, vocabulary 256: GPT-2's block with a tied LM head and tanh GELU), a global batch
of 32 windows of 128 byte tokens per optimizer step, AdamW with the file's lr, betas, eps and
weight decay (on every parameter), its warmup and cosine schedule, gradient clipping at its
clip_norm. Contestants, all under taskset on the same two cores (bench_compare.py's choice):

  crew   --devices cpu:2                          2 replicas x 1 GEMM thread, 16 windows each
  crew   --devices cpu:1 --threads-per-device 2   1 replica x 2 GEMM threads, 32 windows
  crew   --devices cpu:1                          1 replica x 1 thread, 32 windows
  torch  eager, torch.set_num_threads(2) and (1)  fused AdamW where this torch has it on the CPU
  torch  torch.compile (inductor) of the model, 2 and 1 threads; the optimizer stays eager

Each contestant is its own process: --warmup steps, then --steps timed steps. Its figure is the
median step time of the timed steps: crew's `step_s` from the step records of its metrics.jsonl
(start-up and the end-of-run evaluation are not steps), PyTorch's from a clock around forward,
backward, clipping and the update (its batches are cut before the clock starts). tokens/s =
32 x 128 / that median. With --rounds R every contestant runs R times, in turns; its figure is
the median over the rounds in which other processes kept at most 0.25 cores busy, or, where none
was that quiet, the least disturbed round.

Before each contestant the machine is sampled for 2 s: while other processes keep more than
--idle cores busy it waits (up to --idle-wait seconds), and the table's "other procs" column says
how many cores other processes kept busy during the contestant's runs that count (the most of
them), so a figure taken on a busy shared machine can be told from a clean one.

Data: --text (default data/kjv.txt, the King James Bible as `make demo-gpt` writes it; when it is
missing and Debian's `bible` is installed, it is made the same way into a temporary folder),
prepared by `crew prep text --seq-len 128`; PyTorch reads the same train shard.
"""
import argparse
import datetime
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import bench_compare  # noqa: E402  (pick_cores, pinned, busy_cpu_s, loadavg, describe_cores, capture)

MODEL = os.path.join(ROOT, "examples", "gpt_tiny.json")
GLOBAL_BATCH = 32
GOAL = 1.5  # the target: crew's best >= 1.5x PyTorch eager's best
NOISY = 0.25  # other processes' cores during a run above which its figure is flagged

# key, contestant, layout, and crew train's flags, or (mode, threads) for a PyTorch contestant
CONTESTANTS = [
    ("crew_dp2", "crew", "2 replicas x 1 thread", ["--devices", "cpu:2", "--batch-per-device", "16"]),
    ("torch_eager_2", "torch eager", "2 threads", ("eager", 2)),
    ("crew_blas2", "crew", "1 replica x 2 threads",
     ["--devices", "cpu:1", "--threads-per-device", "2", "--batch-per-device", "32"]),
    ("torch_eager_1", "torch eager", "1 thread", ("eager", 1)),
    ("crew_1", "crew", "1 replica x 1 thread", ["--devices", "cpu:1", "--batch-per-device", "32"]),
    ("torch_compile_2", "torch.compile", "2 threads", ("compile", 2)),
    ("torch_compile_1", "torch.compile", "1 thread", ("compile", 1)),
]

log = bench_compare.log


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--crew", default=os.path.join(ROOT, "build", "crew"), help="the crew binary [build/crew]")
    p.add_argument("--text", default=os.path.join(ROOT, "data", "kjv.txt"), help="training text [data/kjv.txt]")
    p.add_argument("--steps", type=int, default=50, help="timed steps per contestant [50]")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps first [10]")
    p.add_argument("--rounds", type=int, default=1, help="runs of every contestant, in turns; the median counts [1]")
    p.add_argument("--skip-compile", action="store_true", help="leave out torch.compile")
    p.add_argument("--idle", type=float, default=0.25,
                   help="before each contestant, wait while other processes keep more cores than this busy [0.25]")
    p.add_argument("--idle-wait", type=float, default=300, help="the longest such wait, in seconds [300]")
    p.add_argument("--markdown", action="store_true", help="print the results as a Markdown table")
    p.add_argument("--json", action="store_true", help="end with one JSON line of all figures")
    # Internal: one PyTorch contestant in a process of its own (see torch_child).
    p.add_argument("--torch-child", nargs=3, metavar=("MODE", "THREADS", "SHARD"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.steps < 1 or a.warmup < 1 or a.rounds < 1:
        p.error("--steps, --warmup and --rounds must be at least 1")
    return a


def model_config():
    """The gpt layer, optimizer and schedule of examples/gpt_tiny.json, as one flat dict."""
    with open(MODEL) as f:
        m = json.load(f)
    (g,) = m["layers"]
    o = m["optimizer"]
    s = o.get("schedule", {})
    s = {"type": s} if isinstance(s, str) else s
    base_batch = o.get("base_batch", GLOBAL_BATCH)
    scale = {"none": 1.0, "linear": GLOBAL_BATCH / base_batch,
             "sqrt": math.sqrt(GLOBAL_BATCH / base_batch)}[o.get("lr_scaling", "none")]
    return {"layers": g["layers"], "heads": g["heads"], "width": g["width"], "context": g["context"],
            "vocab": g["vocab"], "lr": o["lr"] * scale, "betas": (o.get("beta1", 0.9), o.get("beta2", 0.999)),
            "eps": o.get("eps", 1e-8), "weight_decay": o.get("weight_decay", 0.0), "clip_norm": o.get("clip_norm", 0.0),
            "schedule": s.get("type", "constant"), "warmup_steps": s.get("warmup_steps", 0),
            "min_lr": s.get("min_lr", 0.0)}


def learning_rate(cfg, step, total):
    """crew's rate at 1-based step `step` of `total`: linear warmup from 0, then cosine to min_lr."""
    w = cfg["warmup_steps"]
    if step <= w:
        return cfg["lr"] * step / w
    if cfg["schedule"] != "cosine" or total <= w:
        return cfg["lr"]
    t = (step - w) / (total - w)
    return cfg["min_lr"] + (cfg["lr"] - cfg["min_lr"]) * 0.5 * (1 + math.cos(math.pi * t))


# ------------------------------------------------------------------ PyTorch, in a process of its own

def torch_gpt(torch, cfg):
    """GPT-2 as nanoGPT writes it: fused qkv Linear with bias, causal SDPA, tanh GELU, pre-norm,
    final LayerNorm, LM head tied to the token embedding, no dropout; GPT-2's initialisation."""
    nn, F = torch.nn, torch.nn.functional
    C, H, T, V, L = cfg["width"], cfg["heads"], cfg["context"], cfg["vocab"], cfg["layers"]

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(C, eps=1e-5), nn.LayerNorm(C, eps=1e-5)
            self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

        def forward(self, x):
            B, T_, _ = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            q, k, v = (z.view(B, T_, H, C // H).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T_, C))
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
            self.blocks = nn.ModuleList(Block() for _ in range(L))
            self.ln_f = nn.LayerNorm(C, eps=1e-5)
            for name, p in self.named_parameters():
                if p.dim() == 2:
                    std = 0.02 / math.sqrt(2 * L) if name.endswith(("c_proj.weight", "mlp_proj.weight")) else 0.02
                    nn.init.normal_(p, 0.0, std)
                elif "ln" not in name:
                    nn.init.zeros_(p)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            for b in self.blocks:
                x = b(x)
            logits = self.ln_f(x) @ self.wte.weight.t()  # tied LM head
            return F.cross_entropy(logits.view(-1, V), targets.view(-1))

    return GPT()


def torch_child(a):
    """Trains PyTorch's gpt_tiny for --warmup + --steps steps and prints one JSON line."""
    import numpy as np
    import torch
    mode, threads, shard = a.torch_child[0], int(a.torch_child[1]), a.torch_child[2]
    cfg = model_config()
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    T = cfg["context"]
    # Windows as crew cuts them (non-overlapping, 128 inputs + the next token), drawn at random;
    # every batch is cut before the timed loop.
    tokens = np.fromfile(shard, dtype=np.uint16, offset=1024).astype(np.int64)
    rng = np.random.default_rng(1)
    total = a.warmup + a.steps
    starts = rng.choice((len(tokens) - 1) // T, size=(total, GLOBAL_BATCH)) * T
    rows = starts[..., None] + np.arange(T + 1)
    batches = [(torch.from_numpy(tokens[r][:, :-1].copy()), torch.from_numpy(tokens[r][:, 1:].copy())) for r in rows]

    model = torch_gpt(torch, cfg)
    kw = dict(lr=cfg["lr"], betas=cfg["betas"], eps=cfg["eps"], weight_decay=cfg["weight_decay"])
    try:
        opt, optimizer = torch.optim.AdamW(model.parameters(), fused=True, **kw), "fused AdamW"
    except (RuntimeError, TypeError):  # an older torch without the fused CPU kernel
        opt, optimizer = torch.optim.AdamW(model.parameters(), foreach=True, **kw), "foreach AdamW"
    fwd = torch.compile(model) if mode == "compile" else model
    times, losses, first_step_s = [], [], None
    for step in range(1, total + 1):
        x, y = batches[step - 1]
        for group in opt.param_groups:
            group["lr"] = learning_rate(cfg, step, total)
        t0 = time.perf_counter()
        loss = fwd(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg["clip_norm"] > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["clip_norm"])
        opt.step()
        dt = time.perf_counter() - t0
        losses.append(loss.item())
        if step == 1:
            first_step_s = dt
        if step > a.warmup:
            times.append(dt)
    print(json.dumps({"step_s": statistics.median(times), "step_s_min": min(times), "step_s_max": max(times),
                      "first_step_s": first_step_s, "loss_first": losses[0], "loss_last": losses[-1],
                      "torch_version": torch.__version__, "threads": torch.get_num_threads(),
                      "optimizer": optimizer}))


# ------------------------------------------------------------------ the parent: runs and measures

def wait_for_idle(a):
    """Samples the machine for 2 s at a time (this process idle) while other processes keep more
    than --idle cores busy, for --idle-wait seconds at most. Returns the last sample (cores)."""
    t0 = last_log = time.monotonic()
    while True:
        b0, w0 = bench_compare.busy_cpu_s(), time.monotonic()
        time.sleep(2)
        b1, w1 = bench_compare.busy_cpu_s(), time.monotonic()
        if b0 is None or b1 is None:
            return None
        others = (b1 - b0) / (w1 - w0)
        if others <= a.idle or w1 - t0 > a.idle_wait:
            return others
        if w1 - last_log > 30:
            log(f"  other processes keep {others:.2f} cores busy (> {a.idle}): waiting ({w1 - t0:.0f} s so far)")
            last_log = w1


def measured(cmd):
    """Runs cmd; returns (completed process, wall seconds, cores other processes used meanwhile)."""
    log("$ " + " ".join(cmd))
    busy0, kids0, t0 = bench_compare.busy_cpu_s(), os.times(), time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    busy1, kids1, t1 = bench_compare.busy_cpu_s(), os.times(), time.monotonic()
    others = None
    if busy0 is not None and busy1 is not None:
        own = (kids1.children_user + kids1.children_system) - (kids0.children_user + kids0.children_system)
        others = round(max(0.0, (busy1 - busy0 - own) / (t1 - t0)), 3)
    return proc, t1 - t0, others


def crew_contestant(a, data, tmp, key, flags, round_no):
    run_dir = os.path.join(tmp, f"{key}_{round_no}")
    cmd = bench_compare.pinned(a.cores) + [
        a.crew, "train", MODEL, "--data", data, "--run-dir", run_dir, "--quiet",
        "--global-batch", str(GLOBAL_BATCH), "--max-steps", str(a.warmup + a.steps)] + flags
    proc, wall, others = measured(cmd)
    if proc.returncode != 0:
        raise SystemExit(f"bench_gpt: crew failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    plan, steps = bench_compare.run_records(run_dir)
    if plan.get("global_batch") != GLOBAL_BATCH:
        raise SystemExit(f"bench_gpt: crew planned a global batch of {plan.get('global_batch')}, not {GLOBAL_BATCH}")
    timed = [r for r in steps if r["step"] > a.warmup]
    if len(timed) != a.steps:
        raise SystemExit(f"bench_gpt: {len(timed)} timed steps in {run_dir}/metrics.jsonl, wanted {a.steps}")
    t = [r["step_s"] for r in timed]
    # The steps' own clock against the wall clock between the first and last timed step records:
    # a gap between steps (not in step_s) would show as wall_step_s > the mean of step_s.
    prev = next(r for r in steps if r["step"] == a.warmup)
    wall_step = (timed[-1]["time"] - prev["time"]) / len(timed)
    shutil.rmtree(run_dir, ignore_errors=True)
    return {"step_s": statistics.median(t), "step_s_min": min(t), "step_s_max": max(t),
            "step_s_mean": statistics.fmean(t), "wall_step_s": wall_step, "loss_last": timed[-1]["loss"],
            "devices": plan.get("devices"), "batch_per_device": plan.get("batch_per_device"),
            "accumulation": plan.get("accumulation"), "process_wall_s": round(wall, 2), "other_cores": others}


def torch_contestant(a, shard, mode, threads):
    cmd = bench_compare.pinned(a.cores) + [
        sys.executable, os.path.abspath(__file__), "--steps", str(a.steps), "--warmup", str(a.warmup),
        "--torch-child", mode, str(threads), shard]
    proc, wall, others = measured(cmd)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        why = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()][-1:] or [f"exit status {proc.returncode}"]
        return {"failed": why[0][:300], "other_cores": others}
    r = json.loads(lines[-1])
    r.update(process_wall_s=round(wall, 2), other_cores=others)
    return r


def ensure_text(a, tmp):
    if os.path.exists(a.text):
        return a.text
    if shutil.which("bible"):
        path = os.path.join(tmp, "kjv.txt")
        log(f"  {a.text} is missing: writing the King James Bible with Debian's bible into {path}")
        with open(path, "w") as f:
            subprocess.run(["bible", "Gen1:1-Rev22:21"], stdout=f, check=True)
        return path
    raise SystemExit(f"bench_gpt: {a.text} is missing (make demo-gpt writes it, or give --text FILE)")


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def summarise(a, runs):
    """One row per contestant: the median over rounds, and the ratios of crew's rows."""
    rows = []
    for key, who, layout, _ in CONTESTANTS:
        got = [r for r in runs.get(key, []) if "step_s" in r]
        if not runs.get(key):
            continue
        row = {"key": key, "contestant": who, "layout": layout,
               "other_cores": max((r["other_cores"] for r in runs[key] if r.get("other_cores") is not None),
                                  default=None)}
        if not got:
            row["failed"] = runs[key][0].get("failed", "?")
        else:
            # The median of the rounds that other processes left alone; with none, the least
            # disturbed round (and its other_cores shows it).
            clean = [r for r in got if (r.get("other_cores") or 0) <= NOISY]
            use = clean or [min(got, key=lambda r: r.get("other_cores") or 0)]
            s = statistics.median(r["step_s"] for r in use)
            row.update(step_s=s, tokens_per_s=GLOBAL_BATCH * a.context / s, runs=got,
                       rounds_used=[r["round"] for r in use],
                       other_cores=max(r.get("other_cores") or 0 for r in use))
        rows.append(row)
    best = {}
    for who in ("crew", "torch eager", "torch.compile"):
        ok = [r for r in rows if r["contestant"] == who and "tokens_per_s" in r]
        best[who] = max(ok, key=lambda r: r["tokens_per_s"]) if ok else None
    for r in rows:
        if r["contestant"] == "crew" and "tokens_per_s" in r:
            for who, k in (("torch eager", "vs_eager"), ("torch.compile", "vs_compile")):
                r[k] = r["tokens_per_s"] / best[who]["tokens_per_s"] if best[who] else None
    return rows, best


def same_threads(rows, crew_key, torch_key):
    by = {r["key"]: r for r in rows}
    if "tokens_per_s" in by.get(crew_key, {}) and "tokens_per_s" in by.get(torch_key, {}):
        return by[crew_key]["tokens_per_s"] / by[torch_key]["tokens_per_s"]
    return None


def paired(row, other):
    """row's tokens/s over other's, round by round (the rounds that count for both)."""
    theirs = {r["round"]: r["step_s"] for r in other["runs"] if r["round"] in other["rounds_used"]}
    return [theirs[r["round"]] / r["step_s"] for r in row["runs"] if r["round"] in theirs
            and r["round"] in row["rounds_used"]]


def print_report(a, info, rows, best, markdown):
    ratio = lambda v: "" if v is None else f"{v:.2f}x"  # noqa: E731
    other = lambda v: "?" if v is None else f"{v:.2f}"  # noqa: E731
    tok = lambda run: GLOBAL_BATCH * a.context / run["step_s"]  # noqa: E731
    head = (["contestant", "layout", "ms/step", "tokens/s"] + (["rounds: lowest-highest (used)"] if a.rounds > 1 else [])
            + ["crew / eager best", "crew / compile best", "other procs"])
    table = []
    for r in rows:
        if "failed" in r:
            table.append([r["contestant"], r["layout"], "failed", ""] + ([""] if a.rounds > 1 else [])
                         + ["", "", other(r["other_cores"])])
            continue
        mark = "**" if markdown and any(b is r for b in best.values()) else ""
        used = [run for run in r["runs"] if run["round"] in r["rounds_used"]]
        spread = [f"{min(map(tok, used)):,.0f}-{max(map(tok, used)):,.0f} ({len(used)} of {a.rounds})"] \
            if a.rounds > 1 else []
        table.append([r["contestant"], r["layout"], f"{1000 * r['step_s']:.1f}",
                      f"{mark}{r['tokens_per_s']:,.0f}{mark}"] + spread
                     + [ratio(r.get("vs_eager")), ratio(r.get("vs_compile")), other(r["other_cores"])])
    if best["torch.compile"] is None:  # skipped or failed: no column of empty cells
        i = head.index("crew / compile best")
        head, table = head[:i] + head[i + 1:], [t[:i] + t[i + 1:] for t in table]
    steps = (f"median step time of {a.steps} steps after {a.warmup} warm-up steps"
             + (f", median of {a.rounds} rounds (those with other procs <= {NOISY})" if a.rounds > 1 else ""))
    if markdown:
        print(f"Machine: {info['cpu']}, {info['cores']} CPUs, runs on {info['cores_used']}; {info['date']}; "
              f"crew {info['crew']} at {info['commit']} (binary of {info['binary_time']}), "
              f"GEMM {info['gemm']}, torch {info['torch']} ({info['optimizer']}).  ")
        print(f"Command: `{info['command']}`. gpt_tiny, global batch {GLOBAL_BATCH} x {a.context} tokens; {steps}; "
              f"other procs: cores other processes kept busy during the contestant's runs.\n")
        print("| " + " | ".join(head) + " |")
        print("|---|---|" + "--:|" * (len(head) - 2))
        for row in table:
            print("| " + " | ".join(row) + " |")
        print()
    else:
        print(f"gpt_tiny training, global batch {GLOBAL_BATCH} x {a.context} tokens, {steps}")
        print(f"machine: {info['cpu']}, {info['cores']} CPUs (runs on {info['cores_used']}); {info['date']}")
        print(f"crew {info['crew']} at {info['commit']} (binary of {info['binary_time']}), "
              f"GEMM {info['gemm']}; torch {info['torch']} ({info['optimizer']})")
        print(f"command: {info['command']}")
        widths = [max(len(h), *(len(t[i]) for t in table)) for i, h in enumerate(head)]
        print("  ".join(h.ljust(w) if i < 2 else h.rjust(w) for i, (h, w) in enumerate(zip(head, widths))))
        for t in table:
            print("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(t, widths))))
    for r in rows:
        if "failed" in r:
            print(f"{r['contestant']} at {r['layout']} failed: {r['failed']}")
    if best["crew"] and best["torch eager"]:
        v = best["crew"]["tokens_per_s"] / best["torch eager"]["tokens_per_s"]
        print(f"crew's best ({best['crew']['layout']}) / torch eager's best ({best['torch eager']['layout']}): "
              f"{v:.2f}x, goal >= {GOAL}x: "
              + ("not judged, other processes disturbed these figures"
                 if max(best["crew"]["other_cores"] or 0, best["torch eager"]["other_cores"] or 0) > NOISY
                 else "met" if v >= GOAL else "NOT met")
              + (f"; / torch.compile's best ({best['torch.compile']['layout']}): "
                 f"{best['crew']['tokens_per_s'] / best['torch.compile']['tokens_per_s']:.2f}x"
                 if best["torch.compile"] else ""))
    if a.rounds > 1:
        for who in ("torch eager", "torch.compile"):
            if best["crew"] and best[who]:
                per = paired(best["crew"], best[who])
                print(f"  crew / {who}, round by round (the same two layouts, run minutes apart): "
                      + (", ".join(f"{v:.2f}x" for v in per) if per else "no round quiet for both"))
    one = same_threads(rows, "crew_1", "torch_eager_1")
    if one is not None:
        print(f"at one thread each: crew / torch eager {one:.2f}x"
              + (f", crew / torch.compile {same_threads(rows, 'crew_1', 'torch_compile_1'):.2f}x"
                 if same_threads(rows, "crew_1", "torch_compile_1") else ""))
    noisy = [r for r in rows if (r.get("other_cores") or 0) > NOISY]
    if noisy:
        print("warning: other processes used CPU during " + ", ".join(f"{r['contestant']} {r['layout']}"
                                                                    for r in noisy) + ": those figures may be low")


def main():
    a = parse_args()
    if a.torch_child:
        return torch_child(a)
    a.context = model_config()["context"]
    a.cores = bench_compare.pick_cores(2)
    if a.cores is None:
        raise SystemExit("bench_gpt: this process may use only one core; the layouts need two")
    if not os.access(a.crew, os.X_OK):
        raise SystemExit(f"bench_gpt: no {a.crew} (make build, or give --crew)")
    contestants = [c for c in CONTESTANTS if not (a.skip_compile and c[0].startswith("torch_compile"))]
    version = bench_compare.capture([a.crew, "--version"])
    info = {"cpu": cpu_model(), "cores": os.cpu_count(), "cores_used": bench_compare.describe_cores(a.cores),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "crew": version.splitlines()[0].replace("crew ", ""), "gemm": bench_compare.blas_version(version),
            "command": " ".join(["python3", "tools/bench_gpt.py"] + sys.argv[1:]),
            "load_before": bench_compare.loadavg(),
            "commit": bench_compare.capture(["git", "describe", "--always", "--dirty"]),
            "binary_time": datetime.datetime.fromtimestamp(os.path.getmtime(a.crew), datetime.timezone.utc)
            .strftime("%Y-%m-%d %H:%M UTC")}
    runs = {}
    with tempfile.TemporaryDirectory(prefix="crew-bench-gpt-") as tmp:
        text, data = ensure_text(a, tmp), os.path.join(tmp, "data")
        bench_compare.run([a.crew, "prep", "text", text, "--seq-len", str(a.context), "--test-fraction", "0.01",
                           "--out", data], stdout=subprocess.DEVNULL)
        shard = os.path.join(data, "train_000000.bin")
        for round_no in range(a.rounds):
            for key, who, layout, how in contestants:
                idle = wait_for_idle(a)
                if who == "crew":
                    r = crew_contestant(a, data, tmp, key, how, round_no)
                else:
                    r = torch_contestant(a, shard, *how)
                r["other_cores_before"] = None if idle is None else round(idle, 3)
                r["round"] = round_no
                runs.setdefault(key, []).append(r)
                log(f"  -> {who} {layout}: " + (f"{1000 * r['step_s']:.1f} ms/step, "
                                                f"{GLOBAL_BATCH * a.context / r['step_s']:,.0f} tokens/s"
                                                if "step_s" in r else f"failed: {r['failed']}")
                    + f"; other processes used {r.get('other_cores', '?')} cores")
    info["load_after"] = bench_compare.loadavg()
    done = [r for key in runs for r in runs[key] if "torch_version" in r]
    info["torch"] = done[0]["torch_version"] if done else "?"
    info["optimizer"] = done[0]["optimizer"] if done else "?"
    rows, best = summarise(a, runs)
    print_report(a, info, rows, best, a.markdown)
    if a.json:
        print(json.dumps({"machine": info, "steps": a.steps, "warmup": a.warmup, "rounds": a.rounds,
                          "global_batch": GLOBAL_BATCH, "context": a.context, "rows": rows}))


if __name__ == "__main__":
    main()
