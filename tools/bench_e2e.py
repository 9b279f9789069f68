#!/usr/bin/env python3
"""Time to a test accuracy, end to end: crew's demo run against the usual PyTorch loop, same cores.

    python3 tools/bench_e2e.py [--markdown] [--json] [--data DIR] [--build DIR] [--model FILE]
                               [--max-epochs N] [--target 0.90] [--cores N] [--init-weights FILE]

The figure is the one a user waits for: the seconds from starting the program until the model
first reaches the target test accuracy (0.90 by default), everything included: start-up, reading
the dataset's .npy files, training, and the evaluation on the whole test split after every epoch.
Preparing the dataset (`crew prep`) is not counted; both sides read the same prepared files.

crew: `crew train MODEL --data DIR --epochs E --run-dir TMP`, as `make demo` runs it (the default
layout: one replica per core, the model file's batch per device; so a global batch of N x 64 for
examples/fashion_cnn.json on N cores). crew has no flag to stop at an accuracy, so it trains its E
epochs; meanwhile this tool watches RUN_DIR/metrics.jsonl and takes the time at which the first
`epoch` record (written right after that epoch's evaluation) with test_accuracy >= target appears,
counted from the moment the process was started. The whole process's wall time is reported too.

PyTorch: the same model file, built by tools/bench_torch.py (build(); optimizer_of(): AdamW with
the model file's betas, eps and weight decay), trained the usual way: np.load of the same .npy
files, normalised once with the manifest's scale, mean and std into a TensorDataset, a
DataLoader(batch_size = crew's global batch, shuffle=True, drop_last=True as crew drops the last
partial batch, num_workers=0), cross-entropy, and after every epoch net.eval() on the test split
(a DataLoader of the same batch size). It follows crew's learning-rate schedule step for step:
crew scales the model file's rate to the global batch (its lr_scaling rule) and then warms up
(automatically 5 epochs, at most half the run, when the scaling raised the rate) before the
model file's schedule; the tool takes the plan from the run's config.json and checks the rate it
computes against the `lr` crew logged for every step. It stops after the first epoch at or above
the target. torch.set_num_threads(cores used), one inter-op thread. Its time is taken the same
way: from starting the Python process (imports included) to the arrival of that epoch's line.

Both start from their framework's own random initialisation (seed 1), as a user's runs would;
--init-weights FILE starts both from one crew safetensors file instead (build/bench/bench_train
--save-init writes one). The epoch count E is the schedule's length on both sides (crew's cosine
decays over E epochs and its automatic warmup depends on E): by default the model file's
"training" epochs, which is what `make demo` trains (4 for the CNN).

Both run under taskset on the same cores (tools/bench_compare.py's pick_cores: distinct physical
cores first; by default every core this process may use), one after the other, crew first since
PyTorch follows its schedule. crew runs from a copy of its binary, so a rebuild meanwhile does not
disturb it. Printed: machine and versions, and per side the epochs and seconds to the target, the
training part of those seconds, the test accuracy, training samples/s and the process's wall time;
then PyTorch's seconds / crew's seconds against the target ratio (2.0) and whether it is met.
Progress and each command line go to stderr. Needs Python 3 with NumPy and PyTorch.
"""
import argparse
import datetime
import importlib.util
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))

from bench_compare import blas_version, busy_cpu_s, capture, describe_cores, pick_cores, pinned  # noqa: E402

RATIO_TARGET = 2.0  # the issue: PyTorch's time to the accuracy over crew's


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def loadavg():
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# ---------------------------------------------------------------------------------------------
# The learning-rate schedule, as crew computes it (src/optim/optimizer.c, crew_lr_at)
# ---------------------------------------------------------------------------------------------

def schedule_of(config, model_file):
    """crew's learning-rate plan of a run: its config.json's plan (scaled rate, warmup) with the
    model file's schedule parameters (min_lr is scaled by the same factor as the rate)."""
    plan = config["plan"]
    lr = plan["learning_rate"]
    spec = model_file.get("optimizer", {}).get("schedule", "constant")
    if isinstance(spec, str):
        spec = {"type": spec}
    kind = lr.get("schedule", spec.get("type", "constant"))
    return {"type": kind, "base_lr": lr["base"], "base_batch": lr["base_batch"], "scaling": lr["scaling"],
            "factor": lr["factor"], "peak_lr": lr["scaled"], "start_lr": lr["warmup_start"],
            "warmup_steps": int(lr["warmup_steps"]), "total_steps": int(plan["total_steps"]),
            "min_lr": float(spec.get("min_lr", 0.0)) * lr["factor"],
            "step_size": int(spec.get("step_size", 1)), "gamma": float(spec.get("gamma", 0.1)),
            "steps_per_epoch": int(plan["steps_per_epoch"]), "global_batch": int(plan["global_batch"]),
            "seed": int(plan.get("seed", 1))}


def lr_at(s, step):
    """The rate of 0-based step `step` (crew's step record `step` is step + 1)."""
    if step < s["warmup_steps"]:
        f = (step + 1) / s["warmup_steps"]
        return s["start_lr"] + (s["peak_lr"] - s["start_lr"]) * f
    t = step - s["warmup_steps"]
    if s["type"] == "step":
        return s["peak_lr"] * s["gamma"] ** (t // s["step_size"])
    if s["type"] == "cosine":
        span = s["total_steps"] - s["warmup_steps"]
        f = min(1.0, t / span) if span > 0 else 1.0
        return s["min_lr"] + (s["peak_lr"] - s["min_lr"]) * 0.5 * (1.0 + math.cos(math.pi * f))
    return s["peak_lr"]


def describe_schedule(s):
    warm = (f"warmup {s['warmup_steps']} steps from {s['start_lr']:.6g}" if s["warmup_steps"] else "no warmup")
    tail = {"cosine": f"cosine to {s['min_lr']:.6g} at step {s['total_steps']}",
            "step": f"x {s['gamma']:.6g} every {s['step_size']} steps"}.get(s["type"], "then constant")
    return (f"lr {s['base_lr']:.6g} (tuned for batch {s['base_batch']}) x {s['factor']:.4g} ({s['scaling']} rule) "
            f"= {s['peak_lr']:.6g}, {warm}, {tail}")


# ---------------------------------------------------------------------------------------------
# The PyTorch side: this file run as a worker process (--torch-worker), pinned like crew
# ---------------------------------------------------------------------------------------------

def emit(record):
    print(json.dumps(record), flush=True)


def load_split(np, torch, data_dir, split, image):
    """One split of a crew dataset directory as tensors, normalised once: bench_torch.load_data
    (which reads the train split only) for any split. x float32 [N, C, H, W] or [N, F]; y int64."""
    man = json.load(open(os.path.join(data_dir, "manifest.json")))
    sp = man["splits"][split]
    x = np.load(os.path.join(data_dir, sp["x"]["file"]))
    y = np.load(os.path.join(data_dir, sp["y"]["file"])).astype(np.int64)
    norm = man["normalization"]
    mean = np.asarray(norm["mean"], np.float32)
    std = np.asarray(norm["std"], np.float32)
    x = (x.astype(np.float32) * np.float32(norm["scale"]) - mean) / std
    t = torch.from_numpy(x)
    if image:
        t = t.permute(0, 3, 1, 2).contiguous()
    return t, torch.from_numpy(y)


def worker_main(argv):
    """Trains with PyTorch until the target test accuracy or --max-epochs; one JSON line per stage
    on stdout (imported, loaded, each epoch), flushed, so the parent can time their arrival."""
    t_start = time.monotonic()
    p = argparse.ArgumentParser(prog="bench_e2e.py --torch-worker")
    p.add_argument("model")
    p.add_argument("data")
    p.add_argument("--schedule", required=True, help="JSON file of the learning-rate plan (schedule_of)")
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--max-epochs", type=int, required=True)
    p.add_argument("--target", type=float, required=True)
    p.add_argument("--init-weights")
    a = p.parse_args(argv)
    sched = json.load(open(a.schedule))
    batch = sched["global_batch"]
    # bench_torch reads its own command line when imported and fixes torch's thread counts there
    # (torch.set_num_threads(threads), torch.set_num_interop_threads(1)), before any parallel work.
    sys.argv = [os.path.join(ROOT, "tools", "bench_torch.py"), a.model, a.data, "--batch", str(batch),
                "--steps", "1", "--threads", str(a.threads)]
    import bench_torch
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset
    emit({"type": "imported", "torch_version": torch.__version__, "threads": torch.get_num_threads(),
          "interop_threads": torch.get_num_interop_threads(), "thread_summary": bench_torch.thread_summary(),
          "s": time.monotonic() - t_start})

    t0 = time.monotonic()
    model_file = json.load(open(a.model))
    torch.manual_seed(sched["seed"])
    b = bench_torch.build(model_file)
    net = torch.nn.Sequential(*b.modules)
    if a.init_weights:
        bench_torch.load_weights(b, a.init_weights)
    image = len(model_file["input_shape"]) == 3
    train = TensorDataset(*load_split(np, torch, a.data, "train", image))
    test = TensorDataset(*load_split(np, torch, a.data, "test", image))
    gen = torch.Generator()
    gen.manual_seed(sched["seed"])
    train_loader = DataLoader(train, batch_size=batch, shuffle=True, drop_last=True, num_workers=0, generator=gen)
    test_loader = DataLoader(test, batch_size=batch, shuffle=False, num_workers=0)
    opt = bench_torch.optimizer_of(model_file, net.parameters())
    clip = float(model_file.get("optimizer", {}).get("clip_norm", 0) or 0)
    emit({"type": "loaded", "s": time.monotonic() - t0, "train_samples": len(train), "test_samples": len(test),
          "steps_per_epoch": len(train_loader)})

    step = 0
    for epoch in range(a.max_epochs):
        net.train()
        t0 = time.monotonic()
        loss_sum, correct, seen, data_s = 0.0, 0, 0, 0.0
        batches = iter(train_loader)
        while True:
            t1 = time.monotonic()
            try:
                xb, yb = next(batches)  # the DataLoader's work: indexing, collating
            except StopIteration:
                break
            data_s += time.monotonic() - t1
            lr = lr_at(sched, step)
            for group in opt.param_groups:
                group["lr"] = lr
            opt.zero_grad(set_to_none=True)
            out = net(xb)
            loss = F.cross_entropy(out, yb)
            loss.backward()
            if clip > 0:
                torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
            opt.step()
            step += 1
            loss_sum += loss.item() * len(yb)
            correct += (out.argmax(1) == yb).sum().item()
            seen += len(yb)
        train_s = time.monotonic() - t0
        t0 = time.monotonic()
        net.eval()
        test_loss, test_correct = 0.0, 0
        with torch.no_grad():
            for xb, yb in test_loader:
                out = net(xb)
                test_loss += F.cross_entropy(out, yb, reduction="sum").item()
                test_correct += (out.argmax(1) == yb).sum().item()
        acc = test_correct / len(test)
        emit({"type": "epoch", "epoch": epoch, "steps": step, "samples": seen, "train_s": train_s,
              "data_s": data_s, "eval_s": time.monotonic() - t0, "train_loss": loss_sum / seen,
              "train_accuracy": correct / seen, "test_loss": test_loss / len(test), "test_accuracy": acc,
              "last_lr": lr})
        if acc >= a.target:
            break


# ---------------------------------------------------------------------------------------------
# The parent: runs both sides and compares
# ---------------------------------------------------------------------------------------------

def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--markdown", action="store_true", help="print the results as a Markdown table")
    p.add_argument("--json", action="store_true", help="end with all figures as one JSON line")
    p.add_argument("--data", default="data/fashion-mnist", help="prepared dataset [data/fashion-mnist]")
    p.add_argument("--build", default="build", help="build directory [build]")
    p.add_argument("--model", default="examples/fashion_cnn.json", help="model file [examples/fashion_cnn.json]")
    p.add_argument("--max-epochs", type=int, default=0,
                   help="epochs of the schedule, on both sides; each stops at the target [the model file's]")
    p.add_argument("--target", type=float, default=0.90, help="test accuracy to reach [0.90]")
    p.add_argument("--cores", type=int, default=0, help="cores for each side [all this process may use]")
    p.add_argument("--init-weights", help="crew safetensors file both sides start from [each its own init]")
    a = p.parse_args()
    if a.max_epochs < 0 or a.cores < 0:
        p.error("--max-epochs and --cores must be positive")
    if not 0.0 < a.target <= 1.0:
        p.error("--target is an accuracy in (0, 1]")
    return a


def run_checked(cmd):
    log("$ " + " ".join(cmd))
    subprocess.run(cmd, cwd=ROOT, check=True)


def ensure_prerequisites(a):
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("numpy") is None:
        raise SystemExit("bench_e2e: needs PyTorch and NumPy for the comparison: pip install torch numpy")
    crew = os.path.join(ROOT, a.build, "crew")
    if not os.access(crew, os.X_OK):
        run_checked(["make", "build", f"BUILD={a.build}"])
    data = os.path.join(ROOT, a.data)
    if not os.path.isfile(os.path.join(data, "manifest.json")):
        run_checked([crew, "prep", "fashion-mnist", "--out", data])
    return crew, data


def machine_info(crew):
    cpu = "unknown"
    for line in capture(["lscpu"]).splitlines():
        if line.startswith("Model name:"):
            cpu = line.split(":", 1)[1].strip()
    version = capture([crew, "--version"])
    return {"cpu": cpu, "cores": os.cpu_count(), "kernel": platform.release(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "crew": version.splitlines()[0].replace("crew ", ""), "gemm": blas_version(version),
            "python": platform.python_version()}


class Usage:
    """CPU that other processes used while a side ran: machine busy time minus our children's."""

    def __init__(self):
        self.busy, self.kids, self.t = busy_cpu_s(), os.times(), time.monotonic()

    def background_cores(self):
        busy, kids, t = busy_cpu_s(), os.times(), time.monotonic()
        if self.busy is None or busy is None:
            return None
        own = (kids.children_user + kids.children_system) - (self.kids.children_user + self.kids.children_system)
        return round(max(0.0, (busy - self.busy - own) / (t - self.t)), 3)


def new_lines(path, state):
    """Complete lines appended to `path` since the last call (state: [offset, partial bytes])."""
    try:
        with open(path, "rb") as f:
            f.seek(state[0])
            chunk = f.read()
    except FileNotFoundError:
        return []
    state[0] += len(chunk)
    parts = (state[1] + chunk).split(b"\n")
    state[1] = parts.pop()
    return [ln.decode() for ln in parts if ln.strip()]


def run_crew(a, crew, data, cores, tmp):
    """crew train as the demo runs it; each epoch record timed on arrival, from the process start."""
    run_dir = os.path.join(tmp, "run")
    cmd = pinned(cores) + [crew, "train", a.model, "--data", data, "--epochs", str(a.max_epochs), "--run-dir", run_dir]
    if a.init_weights:
        cmd += ["--init-weights", a.init_weights]
    log("$ " + " ".join(cmd))
    metrics, state, epochs, steps = os.path.join(run_dir, "metrics.jsonl"), [0, b""], [], []
    out_path = os.path.join(tmp, "crew_stdout.txt")
    usage = Usage()
    with open(out_path, "w") as out:
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        while True:
            done = proc.poll() is not None
            now = time.monotonic() - t0
            for line in new_lines(metrics, state):
                r = json.loads(line)
                if r.get("type") == "step":
                    steps.append((r["step"], r["lr"]))
                elif r.get("type") == "epoch":
                    r["arrived_s"] = now
                    epochs.append(r)
                    log(f"  crew epoch {r['epoch'] + 1}: test accuracy {r['test_accuracy']:.4f} at {now:.1f} s "
                        f"(training {r['wall_s']:.1f} s, {r['samples_per_s']:.0f} samples/s)")
            if done:
                break
            time.sleep(0.02)
        wall = time.monotonic() - t0
    text = open(out_path).read()
    if proc.returncode != 0:
        raise SystemExit(f"bench_e2e: crew train exited with status {proc.returncode}:\n{text[-3000:]}")
    plan = [ln for ln in text.splitlines() if ln.startswith(("plan:", "      "))]
    for ln in plan:
        log("  " + ln)
    config = json.load(open(os.path.join(run_dir, "config.json")))
    return {"wall_s": wall, "epochs": epochs, "step_lrs": steps, "config": config, "plan_lines": plan,
            "command": cmd, "background_cores": usage.background_cores()}


def run_torch(a, data, cores, sched_path, n_threads):
    cmd = pinned(cores) + [sys.executable, os.path.abspath(__file__), "--torch-worker", a.model, data,
                           "--schedule", sched_path, "--threads", str(n_threads), "--max-epochs", str(a.max_epochs),
                           "--target", str(a.target)]
    if a.init_weights:
        cmd += ["--init-weights", a.init_weights]
    log("$ " + " ".join(cmd))
    usage, records = Usage(), {"epochs": []}
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True, bufsize=1)
    for line in proc.stdout:
        now = time.monotonic() - t0
        if not line.startswith("{"):
            log("  torch: " + line.rstrip())
            continue
        r = json.loads(line)
        r["arrived_s"] = now
        if r["type"] == "epoch":
            records["epochs"].append(r)
            log(f"  torch epoch {r['epoch'] + 1}: test accuracy {r['test_accuracy']:.4f} at {now:.1f} s "
                f"(training {r['train_s']:.1f} s, {r['samples'] / r['train_s']:.0f} samples/s, "
                f"evaluation {r['eval_s']:.1f} s)")
        else:
            records[r["type"]] = r
            log(f"  torch {r['type']} at {now:.1f} s")
    proc.wait()
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"bench_e2e: the PyTorch worker exited with status {proc.returncode}")
    records.update(wall_s=wall, command=cmd, background_cores=usage.background_cores())
    return records


def summarise(epochs, target, train_s, samples):
    """Per side: the first epoch at or above the target and the figures up to it (all epochs run
    when it was not reached)."""
    hit = next((i for i, e in enumerate(epochs) if e["test_accuracy"] >= target), None)
    upto = epochs[: (hit if hit is not None else len(epochs) - 1) + 1]
    train = sum(train_s(e) for e in upto)
    return {"reached": hit is not None, "epochs_to_target": None if hit is None else hit + 1,
            "seconds_to_target": None if hit is None else epochs[hit]["arrived_s"],
            "training_s_to_target": None if hit is None else train,
            "test_accuracy_at_target": None if hit is None else epochs[hit]["test_accuracy"],
            "epochs_run": len(epochs), "last_test_accuracy": epochs[-1]["test_accuracy"] if epochs else None,
            "best_test_accuracy": max((e["test_accuracy"] for e in epochs), default=None),
            "train_samples_per_s": sum(samples(e) for e in upto) / train if train > 0 else None,
            "test_accuracy_per_epoch": [round(e["test_accuracy"], 4) for e in epochs],
            "seconds_per_epoch_end": [round(e["arrived_s"], 2) for e in epochs]}


def compare(crew, torch_, max_epochs):
    """The ratio PyTorch / crew seconds to the target, with how it is to be read."""
    if crew["reached"] and torch_["reached"]:
        r = torch_["seconds_to_target"] / crew["seconds_to_target"]
        return {"ratio": r, "bound": "exact", "met": r >= RATIO_TARGET}
    if crew["reached"]:  # PyTorch's whole run is a lower bound on its time to the target
        r = torch_["wall_s"] / crew["seconds_to_target"]
        return {"ratio": r, "bound": f"a lower bound: PyTorch did not reach it in {max_epochs} epochs",
                "met": True if r >= RATIO_TARGET else None}
    return {"ratio": None, "bound": f"crew did not reach the target in {max_epochs} epochs", "met": False}


def fmt(v, spec, none="—"):
    return none if v is None else format(v, spec)


def table_rows(res, target):
    pct = f"{target:.2f}"
    head = ["side", f"epochs to {pct}", f"s to {pct}", "of which training (s)", f"test acc. at {pct}",
            "test acc. per epoch", "training samples/s", "process wall (s)", "other procs (cores)"]
    rows = []
    for label, key in (("crew", "crew"), ("PyTorch", "torch")):
        s = res[key]
        rows.append([label, fmt(s["epochs_to_target"], "d", f"not in {s['epochs_run']}"),
                     fmt(s["seconds_to_target"], ".1f"), fmt(s["training_s_to_target"], ".1f"),
                     fmt(s["test_accuracy_at_target"], ".4f"),
                     ", ".join(f"{x:.4f}" for x in s["test_accuracy_per_epoch"]),
                     fmt(s["train_samples_per_s"], ".0f"), f"{s['wall_s']:.1f}",
                     fmt(s["background_cores"], ".2f", "?")])
    return head, rows


def verdict_line(cmp):
    if cmp["ratio"] is None:
        return f"PyTorch / crew time to the target: undetermined ({cmp['bound']}): not met"
    word = {True: "met", False: "not met", None: "undetermined"}[cmp["met"]]
    bound = "" if cmp["bound"] == "exact" else f" ({cmp['bound']})"
    return f"PyTorch / crew time to the target: {cmp['ratio']:.2f}x{bound}; wanted >= {RATIO_TARGET:.1f}x: {word}"


def describe_setup(info, res):
    s = res["schedule"]
    return (f"Both on {info['cores_used']} (taskset), one after the other, each timed from its process start to "
            f"the end of the first epoch whose test-set evaluation reached the target (crew: the arrival of "
            f"that `epoch` record in metrics.jsonl; crew then trains on to its {res['max_epochs']} epochs, "
            f"counted in its wall time only). crew: `crew train {res['model']} --epochs {res['max_epochs']}`, "
            f"{res['crew_layout']}. PyTorch: TensorDataset + DataLoader(batch_size={s['global_batch']}, "
            f"shuffle=True, drop_last=True, num_workers=0), torch.set_num_threads({res['torch_threads']}), "
            f"evaluation DataLoader of batch {s['global_batch']}, {res['init']}. Same schedule: {describe_schedule(s)} "
            f"({s['steps_per_epoch']} steps per epoch); PyTorch's rates vs crew's logged ones: largest relative "
            f"difference {res['lr_max_rel_diff']:.1e}.")


def breakdown_line(res):
    """Where each side's seconds to the target (or to its last epoch) went."""
    c, t = res["crew"], res["torch"]
    c_end = c["seconds_to_target"] if c["reached"] else c["seconds_per_epoch_end"][-1]
    t_end = t["seconds_to_target"] if t["reached"] else t["seconds_per_epoch_end"][-1]
    c_train = sum(res["crew_train_s"][: c["epochs_to_target"] or c["epochs_run"]])
    t_train = t["training_s_to_target"] if t["reached"] else sum(res["torch_train_s"])
    known = (t["import_s"] or 0) + (t["data_s"] or 0) + t_train + t["eval_s"]
    return (f"Where the seconds to {res['target']:.2f} went: crew {c_end:.1f} s = training {c_train:.1f} s + "
            f"{c_end - c_train:.1f} s for start-up, loading the dataset and the evaluations; PyTorch {t_end:.1f} s = "
            f"Python and torch imports {fmt(t['import_s'], '.1f')} s + loading the .npy files into tensors and "
            f"building the model {fmt(t['data_s'], '.1f')} s + training {t_train:.1f} s (of which waiting for the "
            f"DataLoader {t['loader_wait_s']:.1f} s) + evaluations {t['eval_s']:.1f} s + the rest "
            f"{t_end - known:.1f} s.")


def print_markdown(info, res, command):
    print(f"Machine: {info['cpu']}, {info['cores']} cores; {info['date']}; crew {info['crew']}, GEMM "
          f"{info['gemm']}, PyTorch {info['torch']}, Python {info['python']}; load average before/after "
          f"{info['load_before']} / {info['load_after']}.  ")
    print(f"Command: `{command}` ({res['elapsed_s']:.0f} s in all). {describe_setup(info, res)}\n")
    head, rows = table_rows(res, res["target"])
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" if i in (0, 5) else "--:" for i in range(len(head))) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print(f"\n{breakdown_line(res)}\n\n**{verdict_line(res['comparison'])}.**")


def print_text(info, res):
    print(f"machine: {info['cpu']}, {info['cores']} cores   date: {info['date']}")
    print(f"crew {info['crew']}   GEMM {info['gemm']}   torch {info['torch']}   python {info['python']}")
    print(f"load avg before/after: {info['load_before']} / {info['load_after']}   runs on {info['cores_used']}   "
          f"{res['elapsed_s']:.0f} s in all")
    print(describe_setup(info, res))
    head, rows = table_rows(res, res["target"])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    print("  ".join(h.ljust(w) if i in (0, 5) else h.rjust(w) for i, (h, w) in enumerate(zip(head, widths))))
    for row in rows:
        print("  ".join(c.ljust(w) if i in (0, 5) else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
    print(breakdown_line(res))
    print(verdict_line(res["comparison"]))


def main():
    a = parse_args()
    started = time.monotonic()
    n = a.cores or len(os.sched_getaffinity(0))
    cores = pick_cores(n)
    if cores is None:
        raise SystemExit(f"bench_e2e: this process may use only {len(os.sched_getaffinity(0))} cores, not {n}")
    build_crew, data = ensure_prerequisites(a)
    model_file = json.load(open(os.path.join(ROOT, a.model)))
    if not a.max_epochs:
        a.max_epochs = int(model_file.get("training", {}).get("epochs", 1))
    info = machine_info(build_crew)
    info["cores_used"] = describe_cores(cores)
    info["load_before"] = loadavg()
    tmp = tempfile.mkdtemp(prefix="crew-bench-e2e-")
    try:
        crew = os.path.join(tmp, "crew")
        shutil.copy2(build_crew, crew)  # a rebuild of --build meanwhile must not change the binary under test
        c = run_crew(a, crew, data, cores, tmp)
        sched = schedule_of(c["config"], model_file)
        diffs = [abs(lr_at(sched, step - 1) - lr) / lr for step, lr in c["step_lrs"] if lr]
        lr_diff = max(diffs) if diffs else float("nan")
        if not diffs or lr_diff > 1e-5:
            log(f"bench_e2e: warning: the PyTorch schedule differs from crew's logged rates by up to {lr_diff:.2e}")
        sched_path = os.path.join(tmp, "schedule.json")
        json.dump(sched, open(sched_path, "w"))
        t = run_torch(a, data, cores, sched_path, len(cores))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    info["load_after"] = loadavg()
    info["torch"] = t.get("imported", {}).get("torch_version", "unknown")

    crew_sum = summarise(c["epochs"], a.target, lambda e: e["wall_s"], lambda e: e["steps"] * sched["global_batch"])
    crew_sum.update(wall_s=c["wall_s"], background_cores=c["background_cores"], plan=c["plan_lines"],
                    command=" ".join(c["command"]))
    torch_sum = summarise(t["epochs"], a.target, lambda e: e["train_s"], lambda e: e["samples"])
    torch_sum.update(wall_s=t["wall_s"], background_cores=t["background_cores"],
                     import_s=t.get("imported", {}).get("s"), data_s=t.get("loaded", {}).get("s"),
                     threads=t.get("imported", {}).get("thread_summary"), command=" ".join(t["command"]))
    upto = t["epochs"][: torch_sum["epochs_to_target"] or len(t["epochs"])]
    torch_sum.update(loader_wait_s=sum(e["data_s"] for e in upto), eval_s=sum(e["eval_s"] for e in upto))
    plan = c["config"]["plan"]
    res = {"model": a.model, "target": a.target, "max_epochs": a.max_epochs, "crew": crew_sum, "torch": torch_sum,
           "crew_train_s": [e["wall_s"] for e in c["epochs"]], "torch_train_s": [e["train_s"] for e in t["epochs"]],
           "schedule": sched, "lr_max_rel_diff": lr_diff, "torch_threads": len(cores),
           "crew_layout": (f"{plan['devices']} replicas x {plan['threads_per_device']} BLAS thread, batch "
                           f"{plan['batch_per_device']} per replica x {plan['accumulation_steps']} accumulation = "
                           f"global batch {plan['global_batch']}, seed {plan['seed']}"),
           "init": (f"both from {a.init_weights}" if a.init_weights
                    else "each side from its own random initialisation (seed 1)")}
    res["comparison"] = compare(crew_sum, torch_sum, a.max_epochs)
    res["elapsed_s"] = time.monotonic() - started
    command = ("python3 tools/bench_e2e.py " + " ".join(sys.argv[1:])).strip()
    if a.markdown:
        print_markdown(info, res, command)
    else:
        print_text(info, res)
    if a.json:
        print(json.dumps({"machine": info, "command": command, "results": res}))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--torch-worker":
        worker_main(sys.argv[2:])
    else:
        main()
