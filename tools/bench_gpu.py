#!/usr/bin/env python3
"""Training speed on one GPU: crew's `--devices cuda:1` against PyTorch on the same GPU, eager and
torch.compile, side by side in one run.

    python3 tools/bench_gpu.py [--crew build-gpu/crew] [--data data/fashion-mnist] [--models cnn,mlp]
                               [--steps 100] [--warmup 20] [--rounds 1] [--skip-compile]
                               [--gpt --gpt-data DIR [--gpt-steps 30] [--gpt-warmup 10] [--peak-tflops 989]]
                               [--device cuda|cpu] [--markdown] [--json]

Models, each trained by every contestant with the same model file, global batch and optimizer
(AdamW with the file's lr scaled by its lr_scaling rule to the global batch, betas, eps, weight
decay on every parameter, clipping at its clip_norm; the learning-rate schedule is left out on
the PyTorch side, it costs nothing measurable):

  cnn  examples/fashion_cnn.json on Fashion-MNIST (--data), global batch 64 (the file's batch)
  mlp  examples/fashion_mlp.json on Fashion-MNIST, global batch 128
  gpt  (--gpt) examples/gpt2_124m.json (--gpt-model) on the token dataset --gpt-data (written by
       `crew prep shards` or `crew prep text`), global batch 64 windows of 1024 tokens
       (--gpt-batch), in micro-batches of 32 on both sides (--gpt-micro-batch; crew plan puts
       crew's replica at 82 GiB with 32, 161 GiB with 64). bf16 when `crew train --help` lists
       --precision (crew --precision bf16, PyTorch autocast to bf16); otherwise both run fp32
       and crew's row says "crew: no --precision bf16 yet".

Contestants, each in a process of its own, one after the other:

  crew           crew train MODEL --devices cuda:1 --batch-per-device B --global-batch G
                 --max-steps warmup+steps (the run's own loader, crew's fp32 GEMMs without TF32)
  torch eager    this script as a child (--torch-child): bench_torch.py's model builder (the
                 fashion models) or bench_gpt.py's GPT-2 (the GPT, its positions made on the
                 GPU), fused AdamW, cudnn.benchmark on; fp32 runs with TF32 off for matmuls and
                 cuDNN, as crew computes
  torch.compile  the same with the loss function (forward + loss) compiled by torch.compile
                 (inductor, default mode); backward and the optimizer as eager (--skip-compile
                 leaves it out)

Data. PyTorch reads the same train split as crew, from crew's dataset directory: the
Fashion-MNIST arrays normalised once as bench_torch.py does ((x * scale - mean) / std), NCHW,
shuffled once (seed 1); the GPT's batches cut before the first step as crew cuts windows
(non-overlapping windows of the context, drawn at random). Either way they are held in pinned CPU
memory and each step's batch is copied to the GPU with non_blocking=True. The GPT trains on the
first train shard of --gpt-data only, which the tool makes into a dataset of its own (crew prep
shards, in a temporary directory) with a val split of one micro-batch: crew evaluates its whole
val split at the end of a run, which for fineweb's 100M-token val shard would take minutes. Byte
tokens (`crew prep text --seq-len 1024`) serve as well as GPT-2's: the speed does not depend on
the token values.

Each contestant runs --warmup steps, then --steps timed steps (the GPT: --gpt-warmup and
--gpt-steps, its steps being slower). Figures, per contestant:

  ms/step    the median step time of the timed steps: crew's `step_s` from the step records of
             its run directory's metrics.jsonl (start-up and the end-of-run evaluation are not
             steps); PyTorch's from a clock around the batch fetch, forward, backward, clipping
             and the update, with torch.cuda.synchronize() before and after
  rate       samples/s (tokens/s for the GPT) = the global batch (x the context) / that median
  data       the median per-step data wait: crew's `data_s` of the slowest replica; PyTorch's
             time from the step's start until its batch is on the GPU (CUDA events around the
             fetch and copy; on the CPU, the clock)
  GPU util   nvidia-smi's utilization.gpu, sampled every 200 ms in the background while the
             contestant runs, mean over the samples inside its timed steps (crew: between the
             times of the step records of the last warm-up step and the last step; PyTorch: the
             child's clock); GPU mem: the most memory.used among them. "n/a" without nvidia-smi,
             with --device cpu, or when no sample fell inside the timed steps (a run under 200 ms)
  crew/eager, crew/compile   crew's rate over PyTorch's, on crew's rows
  MFU        the GPT's 6 x parameters x tokens/s / --peak-tflops (default 989: the H200's bf16
             dense peak; the table says which peak it used, also for an fp32 run)

With --rounds R every contestant runs R times, in turns; a figure is the median over the rounds
(GPU util: the mean). The header gives the GPU, its driver, CUDA (torch's and crew's runtime), the
torch version, the date and crew's git commit. A contestant that fails (out of memory, a
compile error) gets a row marked failed and its error under the table; the others still run.

--device cpu runs the same comparison on the CPU (crew --devices cpu:1 with as many BLAS threads
as the cores this process may use, torch with as many threads): the way to try the tool on a
machine without a GPU. --device cuda (the default) stops at once, exit status 2, when torch sees no GPU or
crew --version lists no cuda:0. Progress and each command line go to stderr. Needs Python 3 with
NumPy and PyTorch.
"""
import argparse
import datetime
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import bench_compare  # noqa: E402  (capture, log, run)

FASHION = {"cnn": "examples/fashion_cnn.json", "mlp": "examples/fashion_mlp.json"}
CONTESTANTS = [("crew", None), ("torch eager", "eager"), ("torch.compile", "compile")]
SAMPLE_MS = 200  # nvidia-smi's sampling period

log = bench_compare.log


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_crew = "build-gpu/crew" if os.access(os.path.join(ROOT, "build-gpu", "crew"), os.X_OK) else "build/crew"
    p.add_argument("--crew", default=default_crew, help=f"the crew binary [{default_crew}]")
    p.add_argument("--data", default="data/fashion-mnist", help="Fashion-MNIST, prepared [data/fashion-mnist]")
    p.add_argument("--models", default="cnn,mlp", help="a comma list of cnn and mlp, or none [cnn,mlp]")
    p.add_argument("--steps", type=int, default=100, help="timed steps per contestant [100]")
    p.add_argument("--warmup", type=int, default=20, help="untimed steps first [20]")
    p.add_argument("--rounds", type=int, default=1, help="runs of every contestant, in turns; the median counts [1]")
    p.add_argument("--skip-compile", action="store_true", help="leave out torch.compile")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="where everything trains [cuda]")
    p.add_argument("--gpt", action="store_true", help="also GPT-2 124M (needs --gpt-data)")
    p.add_argument("--gpt-data", help="a token dataset (crew prep shards / crew prep text)")
    p.add_argument("--gpt-model", default="examples/gpt2_124m.json", help="[examples/gpt2_124m.json]")
    p.add_argument("--gpt-batch", type=int, default=64, help="global batch, in windows of the context [64]")
    p.add_argument("--gpt-micro-batch", type=int, default=32, help="windows per micro-batch, both sides [32]")
    p.add_argument("--gpt-steps", type=int, default=30, help="timed GPT steps [30]")
    p.add_argument("--gpt-warmup", type=int, default=10, help="untimed GPT steps first [10]")
    p.add_argument("--peak-tflops", type=float, default=989.0,
                   help="the GPU's peak for MFU, TFLOP/s [989: H200 bf16 dense]")
    p.add_argument("--markdown", action="store_true", help="print the results as a Markdown table")
    p.add_argument("--json", action="store_true", help="end with one JSON line of all figures")
    # Internal: one PyTorch contestant (a JSON spec) in a process of its own (see torch_child).
    p.add_argument("--torch-child", metavar="SPEC", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.torch_child:
        return a
    # The defaults lie in the repository, a path given on the command line is the caller's.
    for name in ("crew", "data", "gpt_data", "gpt_model"):
        path = getattr(a, name)
        if path:
            setattr(a, name, os.path.join(ROOT, path) if path == p.get_default(name) else os.path.abspath(path))
    a.models = [m.strip() for m in a.models.split(",") if m.strip() and m.strip() != "none"]
    if any(m not in FASHION for m in a.models):
        p.error("--models takes a comma list of cnn and mlp (or none)")
    if min(a.steps, a.warmup, a.rounds, a.gpt_steps, a.gpt_warmup) < 1:
        p.error("--steps, --warmup, --rounds, --gpt-steps and --gpt-warmup must be at least 1")
    if a.gpt and not a.gpt_data:
        p.error("--gpt needs --gpt-data DIR (a token dataset: crew prep shards or crew prep text)")
    if a.gpt and (a.gpt_micro_batch < 1 or a.gpt_batch % a.gpt_micro_batch):
        p.error("--gpt-batch must be a multiple of --gpt-micro-batch")
    if not a.models and not a.gpt:
        p.error("nothing to measure: give --models or --gpt")
    return a


# ------------------------------------------------------------------ what both sides train

def load_model(path):
    with open(os.path.join(ROOT, path)) as f:
        return json.load(f)


def optimizer_config(model_file, global_batch):
    """AdamW's settings from the model file, its lr scaled to the global batch as crew scales it."""
    o = model_file["optimizer"]
    base = o.get("base_batch", global_batch)
    scale = {"none": 1.0, "linear": global_batch / base,
             "sqrt": math.sqrt(global_batch / base)}[o.get("lr_scaling", "none")]
    return {"lr": o["lr"] * scale, "betas": (o.get("beta1", 0.9), o.get("beta2", 0.999)),
            "eps": o.get("eps", 1e-8), "weight_decay": o.get("weight_decay", 0.0),
            "clip_norm": o.get("clip_norm", 0.0) or 0.0}


def gpt_config(model_file):
    (g,) = model_file["layers"]
    return {k: g[k] for k in ("layers", "heads", "width", "context", "vocab")}


def gpt_params(g):
    """GPT-2's parameter count with the LM head tied: embeddings, blocks, the final LayerNorm."""
    C = g["width"]
    return g["vocab"] * C + g["context"] * C + g["layers"] * (12 * C * C + 13 * C) + 2 * C


def tasks(a, crew_help):
    """What is measured: one dict per model, the spec its contestants share."""
    out = []
    for name in a.models:
        m = load_model(FASHION[name])
        batch = m["training"]["batch_per_device"]
        out.append({"kind": "fashion", "name": m["name"], "model": FASHION[name], "data": a.data,
                    "batch": batch, "micro_batch": batch, "unit": "samples/s", "per_sample": 1,
                    "steps": a.steps, "warmup": a.warmup, "bf16": False, "note": ""})
    if a.gpt:
        m = load_model(a.gpt_model)
        g = gpt_config(m)
        bf16 = re.search(r"--precision\b", crew_help) is not None
        out.append({"kind": "gpt", "name": m["name"], "model": a.gpt_model, "data": a.gpt_data,
                    "batch": a.gpt_batch, "micro_batch": a.gpt_micro_batch, "unit": "tokens/s",
                    "per_sample": g["context"], "vocab": g["vocab"], "params": gpt_params(g), "steps": a.gpt_steps,
                    "warmup": a.gpt_warmup, "bf16": bf16, "note": "" if bf16 else "crew: no --precision bf16 yet"})
    return out


def first_train_shard(data_dir):
    with open(os.path.join(data_dir, "manifest.json")) as f:
        shards = json.load(f)["tokens"]["shards"]
    return os.path.join(data_dir, next(s["file"] for s in shards if s["split"] == "train"))


def gpt_dataset(a, task, tmp):
    """The token dataset both sides train the GPT on: --gpt-data's first train shard, and as its
    val split one micro-batch of windows cut from that shard. crew evaluates the whole val split
    at the end of a run (after the timed steps, but a large one, such as fineweb's 100M tokens,
    takes minutes); this keeps it to a moment. Written by crew prep shards; returns its path."""
    import numpy as np
    shard = first_train_shard(task["data"])
    src, out = os.path.join(tmp, "gpt-shards"), os.path.join(tmp, "gpt-data")
    os.makedirs(src)
    os.symlink(shard, os.path.join(src, "bench_train_000000.bin"))
    T = task["per_sample"]
    val = np.memmap(shard, dtype="<u2", mode="r", offset=1024)[:task["micro_batch"] * T + 1]
    header = np.zeros(256, "<i4")
    header[:3] = (20240520, 1, len(val))  # llm.c's magic, version 1 (uint16 tokens), count
    with open(os.path.join(src, "bench_val_000000.bin"), "wb") as f:
        f.write(header.tobytes() + val.tobytes())
    bench_compare.run([a.crew, "prep", "shards", src, "--vocab", str(task["vocab"]), "--seq-len", str(T),
                       "--out", out], stdout=subprocess.DEVNULL)
    return out


# ------------------------------------------------------------------ PyTorch, in a process of its own

def adamw(torch, params, cfg):
    """torch's fused AdamW where this torch has it for the device, else the foreach one."""
    kw = dict(lr=cfg["lr"], betas=cfg["betas"], eps=cfg["eps"], weight_decay=cfg["weight_decay"])
    try:
        return torch.optim.AdamW(params, fused=True, **kw), "fused AdamW"
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(params, foreach=True, **kw), "foreach AdamW"


def fashion_torch(torch, spec, threads):
    """bench_torch.py's network of the model file and the train split, shuffled once: (net, x, y)."""
    # bench_torch reads a command line when imported and sets torch's thread counts from it.
    sys.argv = [os.path.join(ROOT, "tools", "bench_torch.py"), spec["model"], spec["data"],
                "--batch", str(spec["batch"]), "--steps", "1", "--threads", str(threads)]
    import bench_torch
    m = load_model(spec["model"])
    net = torch.nn.Sequential(*bench_torch.build(m).modules)
    x, y = bench_torch.load_data(spec["data"], len(m["input_shape"]) == 3)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(1))
    return net, x[order], y[order]


def gpt_torch(torch, spec, total_steps):
    """bench_gpt.py's GPT-2 of the model file, its forward making the positions on the input's
    device, and total_steps global batches of windows: (net, x, y)."""
    import numpy as np
    import bench_gpt
    F = torch.nn.functional
    g = gpt_config(load_model(spec["model"]))
    gpt = bench_gpt.torch_gpt(torch, g)

    class OnDevice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gpt = gpt

        def forward(self, idx, targets):
            m = self.gpt
            x = m.wte(idx) + m.wpe(torch.arange(idx.shape[1], device=idx.device))
            for block in m.blocks:
                x = block(x)
            logits = m.ln_f(x) @ m.wte.weight.t()  # tied LM head
            return F.cross_entropy(logits.view(-1, g["vocab"]), targets.view(-1))

    tokens = np.memmap(first_train_shard(spec["data"]), dtype="<u2", mode="r", offset=1024)
    T = g["context"]
    starts = np.random.default_rng(1).choice((len(tokens) - 1) // T, size=total_steps * spec["batch"]) * T
    windows = torch.from_numpy(tokens[starts[:, None] + np.arange(T + 1)].astype(np.int64))
    return OnDevice(), windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


def torch_child(a):
    """Trains one PyTorch contestant for warmup + steps steps and prints one JSON line."""
    spec = json.loads(a.torch_child)
    threads = len(os.sched_getaffinity(0))
    total = spec["warmup"] + spec["steps"]
    import torch
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    dev = torch.device(spec["device"])
    cuda = dev.type == "cuda"
    if spec["kind"] == "fashion":
        net, x, y = fashion_torch(torch, spec, threads)
    else:
        net, x, y = gpt_torch(torch, spec, total)
    if cuda:
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 as crew computes it (bf16 runs autocast)
        torch.backends.cudnn.allow_tf32 = False
        x, y = x.pin_memory(), y.pin_memory()
    net = net.to(dev).train()
    cfg = optimizer_config(load_model(spec["model"]), spec["batch"])
    opt, optimizer = adamw(torch, net.parameters(), cfg)

    def loss_of(xb, yb):
        return net(xb, yb) if spec["kind"] == "gpt" else torch.nn.functional.cross_entropy(net(xb), yb)

    loss_fn = torch.compile(loss_of) if spec["mode"] == "compile" else loss_of
    B, mb = spec["batch"], spec["micro_batch"]
    usable = len(y) - len(y) % B
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:  # the data wait on the GPU's clock: from the step's start until its batch is there
        began, copied = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def train_step(i):
        """One optimizer step on the i-th global batch; returns (data seconds or None, last loss)."""
        t0 = time.perf_counter()
        if cuda:
            began.record()
        start = (i * B) % usable
        xb = x[start:start + B].to(dev, non_blocking=True)
        yb = y[start:start + B].to(dev, non_blocking=True)
        if cuda:
            copied.record()
        data = None if cuda else time.perf_counter() - t0
        opt.zero_grad(set_to_none=True)
        for m in range(0, B, mb):
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=spec["bf16"]):
                loss = loss_fn(xb[m:m + mb], yb[m:m + mb]) * (mb / B)
            loss.backward()
        if cfg["clip_norm"] > 0:
            torch.nn.utils.clip_grad_norm_(net.parameters(), cfg["clip_norm"])
        opt.step()
        return data, loss

    step_s, data_s, first_step_s, t_start = [], [], None, None
    for i in range(total):
        if i == spec["warmup"]:
            t_start = time.time()
        sync()
        t0 = time.perf_counter()
        data, loss = train_step(i)
        sync()
        dt = time.perf_counter() - t0
        if i == 0:
            first_step_s = dt
        if i >= spec["warmup"]:
            step_s.append(dt)
            data_s.append(began.elapsed_time(copied) / 1000 if cuda else data)
    t_end = time.time()
    print(json.dumps({"step_s": statistics.median(step_s), "step_s_min": min(step_s), "step_s_max": max(step_s),
                      "data_s": statistics.median(data_s), "first_step_s": first_step_s,
                      "loss_last": loss.item() * B / mb, "t_start": t_start, "t_end": t_end,
                      "peak_mem_mib": torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
                      "torch_version": torch.__version__, "threads": threads, "optimizer": optimizer}))


def torch_probe():
    """Versions, and whether torch sees a GPU, as one JSON line (the parent does not import torch)."""
    import torch
    cuda = torch.cuda.is_available()
    print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda, "gpu_visible": cuda,
                      "gpu": torch.cuda.get_device_name(0) if cuda else None}))


# ------------------------------------------------------------------ the parent: runs and measures

class GpuSampler:
    """nvidia-smi in the background: (Unix time, utilization %, memory used MiB) every SAMPLE_MS, each
    stamped with nvidia-smi's own clock (so a late flush of its output does not move a sample)."""

    def __init__(self, enabled):
        self.samples, self.proc = [], None
        if not enabled or not shutil.which("nvidia-smi"):
            return
        gpu = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
        line_buffered = ["stdbuf", "-oL"] if shutil.which("stdbuf") else []
        self.proc = subprocess.Popen(line_buffered + [
            "nvidia-smi", "-i", gpu, "--query-gpu=timestamp,utilization.gpu,memory.used",
            "--format=csv,noheader,nounits", f"-lms={SAMPLE_MS}"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.reader = threading.Thread(target=self.read, daemon=True)
        self.reader.start()

    def read(self):
        for line in self.proc.stdout:
            try:
                stamp, util, mem = (v.strip() for v in line.split(","))
                t = datetime.datetime.strptime(stamp, "%Y/%m/%d %H:%M:%S.%f").timestamp()  # local time
                self.samples.append((t, float(util), float(mem)))
            except ValueError:
                continue

    def stop(self):
        if self.proc:
            self.proc.terminate()
            self.proc.wait()
            self.reader.join()

    def during(self, t0, t1):
        """Mean utilization and most memory used in [t0, t1]; (None, None) without samples there."""
        inside = [(u, m) for t, u, m in self.samples if t0 <= t <= t1]
        if not inside:
            return None, None
        return statistics.fmean(u for u, _ in inside), max(m for _, m in inside)


def sampled(cmd, gpu):
    """Runs cmd with the GPU sampled meanwhile: (completed process, sampler)."""
    log("$ " + " ".join(cmd))
    sampler = GpuSampler(gpu)
    try:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    finally:
        sampler.stop()
    return proc, sampler


def why_failed(stderr, returncode):
    """The exception a failed process ended with (its last 'SomeError: ...' line), else its last line."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.match(r"^[\w.]*(Error|Exception)\b", ln)]
    return (errors or lines or [f"exit status {returncode}"])[-1][:300]


def crew_contestant(a, task, tmp):
    run_dir = os.path.join(tmp, f"crew-{task['name']}")
    dev = "cuda:1" if a.device == "cuda" else "cpu:1"
    cmd = [a.crew, "train", task["model"], "--data", task["data"], "--run-dir", run_dir, "--replace", "--quiet",
           "--devices", dev, "--batch-per-device", str(task["micro_batch"]), "--global-batch", str(task["batch"]),
           "--max-steps", str(task["warmup"] + task["steps"]), "--checkpoint-every", "1000000"]
    if a.device == "cpu":
        cmd += ["--threads-per-device", str(len(os.sched_getaffinity(0)))]
    if task["bf16"]:
        cmd += ["--precision", "bf16"]
    proc, sampler = sampled(cmd, a.device == "cuda")
    if proc.returncode != 0:
        return {"failed": why_failed(proc.stderr, proc.returncode)}
    plan, steps = bench_compare.run_records(run_dir)
    if plan.get("global_batch") != task["batch"]:
        return {"failed": f"crew planned a global batch of {plan.get('global_batch')}, not {task['batch']}"}
    timed = [r for r in steps if r["step"] > task["warmup"]]
    if len(timed) != task["steps"]:
        return {"failed": f"{len(timed)} timed steps in metrics.jsonl, wanted {task['steps']}"}
    t = [r["step_s"] for r in timed]
    last_warmup = next(r for r in steps if r["step"] == task["warmup"])
    util, mem = sampler.during(last_warmup["time"], timed[-1]["time"])
    shutil.rmtree(run_dir, ignore_errors=True)
    return {"step_s": statistics.median(t), "step_s_min": min(t), "step_s_max": max(t),
            "data_s": statistics.median(max(rep["data_s"] for rep in r["replicas"]) for r in timed),
            "gpu_util": util, "gpu_mem_mib": mem, "loss_last": timed[-1]["loss"]}


def torch_contestant(a, task, mode):
    spec = dict(task, mode=mode, device=a.device)
    proc, sampler = sampled([sys.executable, os.path.abspath(__file__), "--torch-child", json.dumps(spec)],
                            a.device == "cuda")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"failed": why_failed(proc.stderr, proc.returncode)}
    r = json.loads(lines[-1])
    r["gpu_util"], r["gpu_mem_mib"] = sampler.during(r["t_start"], r["t_end"])
    return r


def summarise(a, task, runs):
    """One row per contestant: medians over the rounds, then crew's ratios to PyTorch's."""
    rows = []
    for who, _ in CONTESTANTS:
        if who not in runs:
            continue
        got = [r for r in runs[who] if "step_s" in r]
        row = {"model": task["name"], "contestant": who, "unit": task["unit"],
               "precision": "bf16" if task["bf16"] else "fp32",
               "note": task["note"] if task["kind"] == "gpt" and who == "crew" else ""}
        if not got:
            row["failed"] = runs[who][0]["failed"]
            rows.append(row)
            continue
        step = statistics.median(r["step_s"] for r in got)
        util = [r["gpu_util"] for r in got if r["gpu_util"] is not None]
        mem = [r["gpu_mem_mib"] for r in got if r["gpu_mem_mib"] is not None]
        row.update(step_s=step, rate=task["batch"] * task["per_sample"] / step,
                   data_s=statistics.median(r["data_s"] for r in got),
                   gpu_util=statistics.fmean(util) if util else None, gpu_mem_mib=max(mem) if mem else None,
                   rounds=len(got), runs=got)
        if task["kind"] == "gpt":
            row["mfu"] = 6 * task["params"] * row["rate"] / (a.peak_tflops * 1e12)
        rows.append(row)
    rate = {r["contestant"]: r.get("rate") for r in rows}
    for r in rows:
        if r["contestant"] == "crew" and r.get("rate"):
            for who, key in (("torch eager", "vs_eager"), ("torch.compile", "vs_compile")):
                r[key] = r["rate"] / rate[who] if rate.get(who) else None
    return rows


def gpu_info(probe, version_text):
    """The header's first part: GPU and driver (nvidia-smi), CUDA of torch and of crew."""
    name_driver = bench_compare.capture(["nvidia-smi", "-i", (os.environ.get("CUDA_VISIBLE_DEVICES") or "0")
                                         .split(",")[0], "--query-gpu=name,driver_version",
                                         "--format=csv,noheader"])
    name, _, driver = name_driver.partition(", ")
    crew_cuda = next((ln[len("CUDA: "):].split(";")[0] for ln in version_text.splitlines()
                      if ln.startswith("CUDA: ")), "?")
    return (f"GPU {probe['gpu'] if name == 'unknown' else name}, driver {driver or '?'}, "
            f"CUDA {probe['cuda']} (torch), crew's CUDA {crew_cuda}")


def cpu_info():
    model = next((ln.split(":", 1)[1].strip() for ln in bench_compare.capture(["lscpu"]).splitlines()
                  if ln.startswith("Model name:")), "unknown CPU")
    return f"CPU run (no GPU): {model}, {len(os.sched_getaffinity(0))} threads each side"


def header(a, probe, version_text):
    crew = version_text.splitlines()[0].replace("crew ", "") if version_text != "unknown" else "?"
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    commit = bench_compare.capture(["git", "describe", "--always", "--dirty"])
    where = gpu_info(probe, version_text) if a.device == "cuda" else cpu_info()
    return f"{where}; torch {probe['torch']}; {date}; crew {crew} at {commit}"


def print_report(a, head, rows, markdown):
    opt = lambda v, fmt: "n/a" if v is None else fmt.format(v)  # noqa: E731
    ratio = lambda v: "" if v is None else f"{v:.2f}x"  # noqa: E731
    gpt = any("mfu" in r for r in rows)
    cols = ["model", "contestant", "precision", "ms/step", "rate", "data ms/step", "GPU util", "GPU mem MiB",
            "crew/eager", "crew/compile"] + ([f"MFU (of {a.peak_tflops:g} TFLOP/s)"] if gpt else [])
    table = []
    for r in rows:
        precision = r["precision"] + (f" ({r['note']})" if r["note"] else "")
        if "failed" in r:
            table.append([r["model"], r["contestant"], precision, "failed (below)"] + [""] * (len(cols) - 4))
            continue
        table.append([r["model"], r["contestant"], precision, f"{1000 * r['step_s']:.3f}",
                      f"{r['rate']:,.0f} {r['unit']}", f"{1000 * r['data_s']:.3f}",
                      opt(r["gpu_util"], "{:.0f}%"), opt(r["gpu_mem_mib"], "{:,.0f}"),
                      ratio(r.get("vs_eager")), ratio(r.get("vs_compile"))]
                     + ([opt(r.get("mfu"), "{:.1%}")] if gpt else []))
    if a.skip_compile:
        i = cols.index("crew/compile")
        cols, table = cols[:i] + cols[i + 1:], [t[:i] + t[i + 1:] for t in table]
    steps = "; ".join(([f"median of {a.steps} timed steps after {a.warmup} warm-up"] if a.models else [])
                      + ([f"GPT: median of {a.gpt_steps} after {a.gpt_warmup}"] if a.gpt else [])) + (
        f", median of {a.rounds} rounds" if a.rounds > 1 else "")
    legend = (f"{steps}; data: per-step wait for the batch (crew: data_s of the slowest replica; torch: until "
              f"the batch is on the device); GPU util: nvidia-smi every {SAMPLE_MS} ms during the timed steps, "
              f"mean (mem: the most)" + (f"; MFU: 6 x params x tokens/s / {a.peak_tflops:g} TFLOP/s "
                                         "(--peak-tflops; 989 = H200 bf16 dense)" if gpt else ""))
    if markdown:
        print(f"{head}.  ")
        print(f"Command: `python3 tools/bench_gpu.py {' '.join(sys.argv[1:])}`; {legend}.\n")
        print("| " + " | ".join(cols) + " |")
        print("|---|---|---|" + "--:|" * (len(cols) - 3))
        for t in table:
            print("| " + " | ".join(t) + " |")
        print()
    else:
        print(head)
        print(legend)
        widths = [max(len(h), *(len(t[i]) for t in table)) for i, h in enumerate(cols)]
        for cells in [cols] + table:
            print("  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip())
    for r in rows:
        if "failed" in r:
            print(f"{r['model']}, {r['contestant']} failed: {r['failed']}")


def no_gpu(a, probe, version_text):
    """Why --device cuda cannot run here, or None."""
    why = []
    if not probe["gpu_visible"]:
        why.append(f"torch {probe['torch']} sees no CUDA device")
    if not re.search(r"^CUDA: .*cuda:0", version_text, re.M):
        line = next((ln for ln in version_text.splitlines() if ln.startswith("CUDA: ")), "no CUDA line")
        why.append(f"{a.crew} --version lists no cuda:0 ({line})")
    return "; ".join(why) or None


def main():
    a = parse_args()
    if a.torch_child:
        return torch_probe() if a.torch_child == "probe" else torch_child(a)
    if not os.access(a.crew, os.X_OK):
        raise SystemExit(f"bench_gpu: no {a.crew} (scripts/gpu-check.sh builds build-gpu/crew; or give --crew)")
    probe_run = subprocess.run([sys.executable, os.path.abspath(__file__), "--torch-child", "probe"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if probe_run.returncode != 0:
        raise SystemExit(f"bench_gpu: PyTorch does not load: {why_failed(probe_run.stderr, probe_run.returncode)}")
    probe = json.loads(probe_run.stdout.splitlines()[-1])
    version_text = bench_compare.capture([a.crew, "--version"])
    if a.device == "cuda" and no_gpu(a, probe, version_text):
        print(f"bench_gpu: no GPU visible: {no_gpu(a, probe, version_text)}", file=sys.stderr)
        sys.exit(2)
    if a.models and not os.path.isfile(os.path.join(a.data, "manifest.json")):
        bench_compare.run([a.crew, "prep", "fashion-mnist", "--out", a.data], stdout=subprocess.DEVNULL)
    head = header(a, probe, version_text)
    log(head)
    crew_help = subprocess.run([a.crew, "train", "--help"], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True).stdout
    contestants = [c for c in CONTESTANTS if not (a.skip_compile and c[1] == "compile")]
    todo = tasks(a, crew_help)
    runs = {t["name"]: {} for t in todo}
    with tempfile.TemporaryDirectory(prefix="crew-bench-gpu-") as tmp:
        for task in todo:
            if task["kind"] == "gpt":
                task["data"] = gpt_dataset(a, task, tmp)
        for _ in range(a.rounds):
            for task in todo:
                for who, mode in contestants:
                    r = crew_contestant(a, task, tmp) if mode is None else torch_contestant(a, task, mode)
                    runs[task["name"]].setdefault(who, []).append(r)
                    log(f"  -> {task['name']} {who}: " + (
                        f"{1000 * r['step_s']:.3f} ms/step, {task['batch'] * task['per_sample'] / r['step_s']:,.0f} "
                        f"{task['unit']}" if "step_s" in r else f"failed: {r['failed']}"))
    rows = [row for task in todo for row in summarise(a, task, runs[task["name"]])]
    print_report(a, head, rows, a.markdown)
    if a.json:
        print(json.dumps({"header": head, "device": a.device, "steps": a.steps, "warmup": a.warmup,
                          "gpt_steps": a.gpt_steps if a.gpt else None, "gpt_warmup": a.gpt_warmup if a.gpt else None,
                          "rounds": a.rounds, "peak_tflops": a.peak_tflops,
                          "tasks": [{k: t[k] for k in ("name", "model", "batch", "micro_batch", "bf16")} for t in todo],
                          "rows": rows}))


if __name__ == "__main__":
    main()
