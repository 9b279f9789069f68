#!/usr/bin/env python3
"""The advisor's progress projection against a real run (issue 32): steps to a target loss at a
4x larger global batch, predicted from a run's gradient noise scale, then measured.

    python3 tools/bench_goodput.py [--crew build/crew] [--data data/fashion-mnist] [--model mlp]
                                   [--optimizer file|sgd]
                                   [--batch 256] [--factor 4] [--epochs 3] [--seeds 1,2,3]
                                   [--rules sqrt,linear] [--window 12800] [--out DIR]

For each seed:
  1. a base run of the model at global batch M0 = --batch for --epochs epochs, at the model file's
     rate with --base-batch M0 (so the base run's rate is the file's, unscaled), a constant rate
     and no warmup (a schedule that would stretch with the run's length, or a warmup, would make
     the two runs' rates differ in ways the noise scale knows nothing of);
  2. the target: the base run's training loss at its end, smoothed over a centred window of
     --window samples; S0 = the first step whose smoothed loss is at or below it;
  3. the prediction, by crew itself: `crew plan --from BASE_RUN --global-batch M` with M = factor x
     M0 gives steps_ratio = (M0 / M) / E(M), E(M) = (B + M0) / (B + M), B the noise scale the base
     run measured at its end; predicted steps S = S0 x steps_ratio;
  4. the measurement: a run at M (the same seed and model; the rate scaled from M0 by each
     --rules rule, constant, no warmup) long enough to pass the target, and its first step whose
     smoothed loss (the same window in samples) is at or below the target.
The error is predicted / measured - 1, per seed and rule, and their median.

The noise-scale model (McCandlish et al. 2018) holds for a rate tuned at each batch; the scaling
rules are how crew users set it, so the error measures the advisor as it would be used. Progress
to stderr, the table to stdout.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = {"mlp": "examples/fashion_mlp.json", "cnn": "examples/fashion_cnn.json"}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def constant_rate_model(name, optimizer, out_dir):
    with open(os.path.join(ROOT, MODELS[name])) as f:
        spec = json.load(f)
    if optimizer == "sgd":  # the optimizer the noise-scale model was derived for
        spec["optimizer"] = {"type": "sgd", "lr": 0.05, "momentum": 0.9, "base_batch": 128}
    spec["optimizer"]["schedule"] = {"type": "constant"}
    path = os.path.join(out_dir, f"{name}-{optimizer}-constant.json")
    with open(path, "w") as f:
        json.dump(spec, f)
    return path


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"bench_goodput: {' '.join(cmd)} exited {p.returncode}:\n{p.stderr[-800:]}")
    return p.stdout


def train(a, model, batch, rule, epochs, seed, run_dir):
    devices = int(a.devices.split(":")[1])
    run([a.crew, "train", model, "--data", a.data, "--devices", a.devices,
         "--batch-per-device", str(min(batch // devices, 512)), "--global-batch", str(batch),
         "--base-batch", str(a.batch), "--lr-scaling", rule, "--warmup-steps", "0", "--epochs", str(epochs),
         "--seed", str(seed), "--run-dir", run_dir])
    losses = []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            o = json.loads(line)
            if o.get("type") == "step":
                losses.append(o["loss"])
    return losses


def smoothed(losses, batch, window):
    """Centred moving average over `window` samples' worth of steps; None where it does not fit."""
    half = max(1, round(window / batch / 2))
    out = [None] * len(losses)
    run_sum = 0.0
    prefix = [0.0]
    for v in losses:
        run_sum += v
        prefix.append(run_sum)
    for i in range(half, len(losses) - half):
        out[i] = (prefix[i + half + 1] - prefix[i - half]) / (2 * half + 1)
    return out


def first_at_or_below(curve, target):
    for i, v in enumerate(curve):
        if v is not None and v <= target:
            return i + 1  # steps are counted from 1
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--crew", default=os.path.join(ROOT, "build", "crew"))
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "fashion-mnist"))
    ap.add_argument("--model", default="mlp", choices=sorted(MODELS))
    ap.add_argument("--optimizer", default="file", choices=["file", "sgd"],
                    help="the model file's (AdamW), or SGD with momentum 0.9 at 0.05")
    ap.add_argument("--devices", default="cpu:2")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--factor", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--rules", default="sqrt,linear")
    ap.add_argument("--window", type=int, default=12800, help="samples the loss is smoothed over")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    out = a.out or tempfile.mkdtemp(prefix="crew-bench-goodput-")
    os.makedirs(out, exist_ok=True)
    model = constant_rate_model(a.model, a.optimizer, out)
    big = a.factor * a.batch
    rows = []
    for seed in [int(s) for s in a.seeds.split(",")]:
        base_dir = os.path.join(out, f"base-{seed}")
        base = smoothed(train(a, model, a.batch, "none", a.epochs, seed, base_dir), a.batch, a.window)
        ends = [v for v in base if v is not None]
        target = ends[-1]
        s0 = first_at_or_below(base, target)
        plan = json.loads(run([a.crew, "plan", model, "--devices", a.devices, "--global-batch", str(big),
                               "--batch-per-device", str(min(big // int(a.devices.split(':')[1]), 512)),
                               "--from", base_dir, "--json"]).splitlines()[-1])
        noise = plan["noise"]
        predicted = s0 * noise["steps_ratio"]
        log(f"seed {seed}: target loss {target:.4f} reached at step {s0} of batch {a.batch}; B_noise "
            f"{noise['noise_scale']:.0f}, E({big}) = {noise['statistical_efficiency']:.3f}: predicted "
            f"{predicted:.0f} steps at {big}")
        for rule in a.rules.split(","):
            # long enough to pass the target even with no gain from the larger batch at all
            curve = smoothed(train(a, model, big, rule, a.epochs * 2, seed, os.path.join(out, f"{rule}-{seed}")),
                             big, a.window)
            measured = first_at_or_below(curve, target)
            err = predicted / measured - 1 if measured else None
            log(f"  {rule}: measured {measured} steps" + (f", error {100 * err:+.1f}%" if err is not None else
                                                           " (the target was not reached)"))
            rows.append({"seed": seed, "rule": rule, "target": target, "s0": s0, "noise": noise["noise_scale"],
                         "e": noise["statistical_efficiency"], "predicted": predicted, "measured": measured,
                         "error": err})
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"# {platform.node()}, {os.cpu_count()} cores, {when}: {a.model} ({a.optimizer}), {a.devices}, base batch {a.batch} for "
          f"{a.epochs} epochs, {a.factor}x = {big}; loss smoothed over {a.window} samples")
    print(f"| seed | rate rule at {big} | target loss | steps at {a.batch} | B_noise (base run's end) | E({big}) "
          f"| predicted steps at {big} | measured | error |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        m = r["measured"] if r["measured"] else "not reached"
        e = f"{100 * r['error']:+.1f}%" if r["error"] is not None else "-"
        print(f"| {r['seed']} | {r['rule']} | {r['target']:.4f} | {r['s0']} | {r['noise']:.0f} | {r['e']:.3f} | "
              f"{r['predicted']:.0f} | {m} | {e} |")
    print()
    for rule in a.rules.split(","):
        errs = [r["error"] for r in rows if r["rule"] == rule and r["error"] is not None]
        if errs:
            print(f"{rule}: median error {100 * statistics.median(errs):+.1f}% over {len(errs)} seed(s) "
                  f"(from {100 * min(errs):+.1f}% to {100 * max(errs):+.1f}%)")


if __name__ == "__main__":
    main()
