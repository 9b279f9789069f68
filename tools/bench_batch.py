#!/usr/bin/env python3
"""Which global batch pays (issue 32): test accuracy after the same number of epochs at global
batches of 128, 1024 and 4096, with AdamW (the rate scaled linearly or by the square root of the
batch, with crew's automatic warmup) and with LAMB (square root, warmup), beside the gradient noise
scale each run measured.

    python3 tools/bench_batch.py [--crew build/crew] [--data data/fashion-mnist] [--models mlp,cnn]
                                 [--batches 128,1024,4096] [--epochs mlp=10,cnn=6] [--devices cpu:2]
                                 [--lamb-lr 0.005] [--seed 1] [--out DIR] [--markdown]

Every run is `crew train` on the example model file (examples/fashion_mlp.json, fashion_cnn.json)
with its optimizer swapped where the row says so: AdamW as the file has it (lr 1e-3, weight decay
1e-4, the file's schedule), LAMB with the same schedule and weight decay and --lamb-lr. Both rates
count as tuned for the first --batches figure (--base-batch) and are scaled from it by the rule, as
a user scaling out would do; nothing is retuned per batch (--lamb-lr 0.005 was the best of 0.001,
0.002, 0.005 and 0.01 for the MLP at 128). Larger global batches are
--global-batch over the replicas' --batch-per-device (at most 512), the rest accumulation: the
same arithmetic as that many devices (crew's determinism contract), on this machine's cores.

The figures come from each run's directory: the summary's test accuracy and loss and its gradient
noise scale (metrics.jsonl), the scaled rate and warmup (its run line). Progress goes to stderr;
the table to stdout. B_noise per epoch pools that epoch's measured steps (mean |G_b|^2 and |G_B|^2,
then crew's estimates); crew's own figure at the end is smoothed over about the last 100 steps, and
says "too large" when |G|^2 there is lost in the noise (late in a run the gradient's signal is
small against its noise: B_noise grows as training goes on).
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = {"mlp": "examples/fashion_mlp.json", "cnn": "examples/fashion_cnn.json"}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def model_file(name, optimizer, lamb_lr, out_dir):
    """The example model file, with LAMB in place of AdamW when asked."""
    with open(os.path.join(ROOT, MODELS[name])) as f:
        spec = json.load(f)
    if optimizer == "lamb":
        o = spec["optimizer"]
        spec["optimizer"] = {"type": "lamb", "lr": lamb_lr, "base_batch": o.get("base_batch", 128),
                             "weight_decay": o.get("weight_decay", 0.0), "schedule": o.get("schedule", {})}
    path = os.path.join(out_dir, f"{name}-{optimizer}.json")
    with open(path, "w") as f:
        json.dump(spec, f)
    return path


def pooled_noise(steps):
    """B_simple from the mean |G_b|^2 (S) and |G_B|^2 (L) of a span of measured steps: the same
    unbiased estimates as crew's, pooled over the span instead of smoothed, so a span late in a run
    (where |G|^2 is small against the noise) still gives a figure. None when |G|^2 <= 0."""
    if not steps:
        return None
    S = sum(x["grad_sq_small"] for x in steps) / len(steps)
    L = sum(x["grad_sq_big"] for x in steps) / len(steps)
    b, B = steps[0]["small_batch"], steps[0]["global_batch"]
    g2 = (B * L - b * S) / (B - b)
    trace = (S - L) / (1 / b - 1 / B)
    return trace / g2 if g2 > 0 else None


def read_run(run_dir):
    run = summary = None
    measured = {}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            o = json.loads(line)
            if o.get("type") == "run" and run is None:
                run = o
            elif o.get("type") == "summary":
                summary = o
            elif o.get("type") == "step" and "grad_sq_small" in o:
                measured.setdefault(o["epoch"], []).append(o)
    epochs = sorted(measured)
    first = pooled_noise(measured[epochs[0]]) if epochs else None
    last = pooled_noise(measured[epochs[-1]]) if epochs else None
    return run, summary, first, last


def train(a, name, optimizer, rule, batch, base_batch, epochs, out_dir):
    run_dir = os.path.join(out_dir, f"{name}-{optimizer}-{rule}-{batch}")
    devices = int(a.devices.split(":")[1])
    per_device = min(batch // devices, 512)
    cmd = [a.crew, "train", model_file(name, optimizer, a.lamb_lr, out_dir), "--data", a.data,
           "--devices", a.devices, "--batch-per-device", str(per_device), "--global-batch", str(batch),
           "--base-batch", str(base_batch), "--lr-scaling", rule, "--epochs", str(epochs), "--seed", str(a.seed), "--run-dir", run_dir]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        log(f"  FAILED ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-600:]}")
        return None
    run, s, first, last = read_run(run_dir)
    row = {"model": name, "optimizer": optimizer, "rule": rule, "batch": batch, "epochs": epochs,
           "lr": run["scaled_lr"], "warmup_steps": run["warmup_steps"], "steps": s["steps"],
           "accuracy": s["test_accuracy"], "loss": s["test_loss"], "noise_scale": s.get("noise_scale"),
           "noise_first": first, "noise_last": last, "wall_s": wall}
    log(f"  {name} {optimizer:5s} {rule:6s} batch {batch:5d}: accuracy {row['accuracy']:.4f}, "
        f"loss {row['loss']:.4f}, B_noise {row['noise_scale']} (epochs: first {first}, last {last}), {wall:.0f} s")
    return row


def parse_epochs(text):
    out = {}
    for part in text.split(","):
        k, v = part.split("=")
        out[k] = int(v)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--crew", default=os.path.join(ROOT, "build", "crew"))
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "fashion-mnist"))
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--batches", default="128,1024,4096")
    ap.add_argument("--epochs", default="mlp=10,cnn=6")
    ap.add_argument("--devices", default="cpu:2")
    ap.add_argument("--lamb-lr", type=float, default=0.005)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=None, help="keep the run directories here [a temporary directory]")
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    epochs = parse_epochs(a.epochs)
    batches = [int(b) for b in a.batches.split(",")]
    out_dir = a.out or tempfile.mkdtemp(prefix="crew-bench-batch-")
    os.makedirs(out_dir, exist_ok=True)
    log(f"bench_batch: runs in {out_dir}")
    rows = []
    for name in a.models.split(","):
        for batch in batches:
            # at the base batch the rules agree (a factor of 1, no warmup): one AdamW run
            rules = ["linear", "sqrt"] if batch != batches[0] else ["none"]
            for rule in rules:
                r = train(a, name, "adamw", rule, batch, batches[0], epochs[name], out_dir)
                if r:
                    rows.append(r)
            r = train(a, name, "lamb", "sqrt" if batch != batches[0] else "none", batch, batches[0], epochs[name],
                      out_dir)
            if r:
                rows.append(r)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"# {platform.node()}, {os.cpu_count()} cores, {when}; {a.devices}, seed {a.seed}, "
          f"LAMB lr {a.lamb_lr} at {batches[0]}")
    print("| model | global batch | optimizer | rate rule | peak rate | warmup steps | steps | test accuracy "
          f"| vs AdamW at {batches[0]} | B_noise, first epoch | B_noise, last epoch | crew's B_noise at the end "
          "| time |")
    print("|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")

    def num(v):
        return f"{v:.0f}" if v else "too large"

    verdicts = []
    for name in a.models.split(","):
        base = next((r for r in rows if r["model"] == name and r["batch"] == batches[0] and r["optimizer"] == "adamw"),
                    None)
        for r in (r for r in rows if r["model"] == name):
            d = f"{100 * (r['accuracy'] - base['accuracy']):+.2f} pt" if base else "-"
            print(f"| {name} | {r['batch']} | {'AdamW' if r['optimizer'] == 'adamw' else 'LAMB'} | {r['rule']} | "
                  f"{r['lr']:.3g} | {r['warmup_steps']} | {r['steps']} | {r['accuracy']:.4f} | {d} | "
                  f"{num(r['noise_first'])} | {num(r['noise_last'])} | {num(r['noise_scale'])} | {r['wall_s']:.0f} s |")
        lamb = next((r for r in rows if r["model"] == name and r["batch"] == batches[-1] and r["optimizer"] == "lamb"),
                    None)
        if base and lamb:
            gap = 100 * (base["accuracy"] - lamb["accuracy"])
            verdicts.append(f"{name}: LAMB at {batches[-1]} reaches {lamb['accuracy']:.4f} against AdamW's "
                            f"{base['accuracy']:.4f} at {batches[0]}: {gap:.2f} points lower, "
                            f"{'within' if gap <= 1.0 else 'outside'} the 1-point target")
    print()
    for v in verdicts:
        print(v)


if __name__ == "__main__":
    main()
