#!/usr/bin/env python3
"""Pipeline throughput against the bubble formula and against data parallelism, in one command.

    python3 tools/bench_pipeline.py [--data DIR] [--build DIR] [--model FILE] [--steps 300]
                                    [--micro-batches 8] [--batch 32] [--rounds 3] [--markdown] [--json]

For one model (the wide MLP of examples/ by default: four 1024-wide dense layers, which split
into stages of equal cost) it runs crew train for --steps steps, all at the same global batch
(--batch samples per micro-batch × --micro-batches per pipeline), --rounds rounds of each layout
in turn:

  1 device               one replica accumulating every micro-batch: the baseline rate r1
  K devices, data parallel   K replicas (the lesson's first choice, where the model fits)
  K stages, 1F1B and GPipe   one pipeline of K stages, for K = 2 and 4

and prints each layout's median training samples/s (crew's own count of training steps, not
start-up or evaluation), the stages' measured idle share (the bubble, from the run's summary)
next to the ideal (K − 1)/(m + K − 1), and two ratios: the pipeline against the ideal pipeline,
r1 · K · (1 − ideal bubble) (stages of equal cost, free sends), and against data parallelism on
the same devices. Layouts with more stages than the machine has cores run oversubscribed, and the
table says so: their figures measure contention, not the schedule.

Nothing here is a test; docs/PERFORMANCE.md records its output with the machine and the date.
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


def run_crew(args, crew, layout, run_dir):
    cmd = [crew, "train", args.model, "--data", args.data, "--max-steps", str(args.steps), "--seed", "1",
           "--batch-per-device", str(args.batch), "--global-batch", str(args.batch * args.micro_batches),
           "--checkpoint-every", "100000", "--run-dir", run_dir, "--replace", "--quiet", "--json",
           "--loader-threads", "1"] + layout
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=os.path.join(root, "data", "fashion-mnist"))
    p.add_argument("--build", default=os.path.join(root, "build"))
    p.add_argument("--model", default=os.path.join(root, "examples", "fashion_wide_mlp.json"))
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--micro-batches", type=int, default=8)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    crew = os.path.join(args.build, "crew")
    if not os.path.exists(os.path.join(args.data, "manifest.json")):
        sys.exit(f"bench_pipeline: no prepared dataset in {args.data} (make demo prepares one, or give --data)")
    m = args.micro_batches
    layouts = [("1 device", ["--devices", "cpu:1"], 1, 1)]
    for k in (2, 4):
        layouts.append((f"{k} devices, data parallel", ["--devices", f"cpu:{k}"], k, 1))
        for sch in ("1f1b", "gpipe"):
            layouts.append((f"{k} stages, {sch}", ["--devices", f"cpu:{k}", "--pipeline", str(k), "--schedule", sch], k, k))
    rates = {name: [] for name, *_ in layouts}
    bubbles = {name: [] for name, *_ in layouts}
    with tempfile.TemporaryDirectory(prefix="crew-bench-pipeline-") as tmp:
        for _ in range(args.rounds):
            for name, flags, _, _ in layouts:
                r = run_crew(args, crew, flags, os.path.join(tmp, "run"))
                rates[name].append(r["samples_per_s"])
                if r.get("bubble_fraction") is not None:
                    bubbles[name].append(r["bubble_fraction"])
    cores = os.cpu_count() or 1
    r1 = statistics.median(rates["1 device"])
    rows = []
    for name, _, devices, stages in layouts:
        rate = statistics.median(rates[name])
        row = {"layout": name, "devices": devices, "samples_per_s": rate, "oversubscribed": devices > cores}
        if stages > 1:
            ideal_bubble = (stages - 1) / (m + stages - 1)
            ideal = r1 * stages * (1 - ideal_bubble)
            dp = statistics.median(rates[f"{stages} devices, data parallel"])
            row.update({"bubble": statistics.median(bubbles[name]) if bubbles[name] else None,
                        "ideal_bubble": ideal_bubble, "vs_ideal": rate / ideal, "vs_data_parallel": rate / dp})
        rows.append(row)
    when = datetime.date.today().isoformat()
    machine = f"{platform.node()}, {cores} cores, {platform.processor() or platform.machine()}"
    if args.json:
        print(json.dumps({"date": when, "machine": machine, "micro_batches": m, "batch": args.batch,
                          "steps": args.steps, "rounds": args.rounds, "rows": rows}))
        return
    print(f"{when}, {machine}: {os.path.basename(args.model)}, global batch {args.batch * m} "
          f"({m} micro-batches of {args.batch}), {args.steps} steps, median of {args.rounds} rounds")
    head = ["layout", "samples/s", "bubble (measured)", "bubble (ideal)", "vs ideal pipeline", "vs data parallel"]
    if args.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
    else:
        print(f"{head[0]:34} {head[1]:>10} {head[2]:>18} {head[3]:>15} {head[4]:>18} {head[5]:>17}")
    for r in rows:
        name = r["layout"] + (" (oversubscribed)" if r["oversubscribed"] else "")
        cells = [name, f"{r['samples_per_s']:.0f}"]
        if "ideal_bubble" in r:
            b = r["bubble"]
            cells += [f"{100 * b:.0f}%" if b is not None else "-", f"{100 * r['ideal_bubble']:.0f}%",
                      f"{r['vs_ideal']:.2f}x", f"{r['vs_data_parallel']:.2f}x"]
        else:
            cells += ["", "", "", ""]
        if args.markdown:
            print("| " + " | ".join(cells) + " |")
        else:
            print(f"{cells[0]:34} {cells[1]:>10} {cells[2]:>18} {cells[3]:>15} {cells[4]:>18} {cells[5]:>17}")


if __name__ == "__main__":
    main()
