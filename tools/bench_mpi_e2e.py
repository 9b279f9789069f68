#!/usr/bin/env python3
"""End to end across processes (issue 13): crew on 2 MPI processes, crew on 2 threads and PyTorch DDP.

    python3 tools/bench_mpi_e2e.py [--model examples/fashion_cnn.json] [--data DIR] [--build DIR]
                                   [--batch 64] [--steps 300] [--warmup 10] [--rounds 3]
                                   [--max-load 1.0] [--markdown] [--json]

Trains the model file with the same per-device batch B and the same step count in every
configuration, on P = 2 devices (one core each) and on one:

  crew_1       crew train --devices cpu:1 --batch-per-device B              1 replica (baseline)
  crew_1_acc   crew train --devices cpu:1 --batch-per-device B --global-batch 2B
                                                                            1 replica, 2 micro-batches
  crew_thr     crew train --devices cpu:2 --batch-per-device B              1 process x 2 threads
  crew_mpi     mpirun -np 2 --bind-to none crew train --devices cpu:1 ...   2 processes x 1 replica
  crew_mpi_core  the same with mpirun --bind-to core
  torch_1      tools/bench_ddp.py --procs 1 --batch B                       1 process, 1 thread (baseline)
  ddp          tools/bench_ddp.py --procs 2 --batch B                       DDP gloo, 2 processes x 1 thread
  ddp_core     the same, process p pinned to CPU p (as --bind-to core)

Every configuration runs once per round; the rounds alternate the order (forward, then backward),
so that drift of a shared VM meets every configuration alike. Before each round the script waits
while the 1-minute load average is above --max-load (polling every 20 s, at most 10 minutes) and
records it; for every run it records the CPU that other processes used meanwhile (machine busy
time from /proc/stat minus the run's own, per second), as tools/bench_compare.py does.

A crew run trains W + S steps (--max-steps, --warmup W, --steps S) with --quiet --json, its run
directory under --out with --replace, and --checkpoint-every 100000 (so only the final checkpoint
is written, after the timed steps). Its figure is the JSON line's samples_per_s (all W + S steps,
evaluation excluded); the steady figure next to it comes from metrics.jsonl: S x global batch over
the time from the end of step W to the end of step W + S. PyTorch runs W untimed warm-up steps and
then S timed steps (tools/bench_ddp.py, --repeats 1). All runs start from the same initial weights
(bench/bench_train --save-init, when the build has it; crew --init-weights, bench_ddp.py
--init-weights).

Data-parallel efficiency = throughput on P devices / (P x throughput of one device at the same
per-device batch): crew_thr and crew_mpi against crew_1, ddp against torch_1, each the median of
the per-round ratios (min-max beside it). crew_1_acc is the one-device run at the same global
batch; "speed-up" is a P-device figure over it. The table also shows, for crew, the per-step means
of its telemetry over the steady steps (docs/METRICS.md): forward, backward, exposed all-reduce
wait and data wait, averaged over replicas.

It needs build/crew (built by `make`), mpirun (Open MPI), Python 3 with NumPy and PyTorch, and the
dataset (prepared with `crew prep fashion-mnist` when missing). As root it sets
OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM) for mpirun. Progress and each command go to stderr.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import bench_compare  # noqa: E402  (busy_cpu_s, machine_info, loadavg)

P = 2
CONFIGS = ["crew_1", "crew_1_acc", "crew_thr", "crew_mpi", "crew_mpi_core", "torch_1", "ddp", "ddp_core"]
LABELS = {
    "crew_1": "A  crew 1 proc x 1 replica, batch 64 (baseline)",
    "crew_1_acc": "A' crew 1 proc x 1 replica, global 128 (2 micro-batches)",
    "crew_thr": "B  crew 1 proc x 2 threads",
    "crew_mpi": "C  crew 2 MPI procs x 1 replica, --bind-to none",
    "crew_mpi_core": "C' crew 2 MPI procs x 1 replica, --bind-to core",
    "torch_1": "D0 torch 1 proc x 1 thread, batch 64 (baseline)",
    "ddp": "D  torch DDP gloo 2 procs x 1 thread, bind none",
    "ddp_core": "D' torch DDP gloo 2 procs x 1 thread, bind core",
}
BASELINE = {"crew_thr": "crew_1", "crew_mpi": "crew_1", "crew_mpi_core": "crew_1",
            "ddp": "torch_1", "ddp_core": "torch_1"}
DEVICES = {"crew_1": 1, "crew_1_acc": 1, "crew_thr": P, "crew_mpi": P, "crew_mpi_core": P,
           "torch_1": 1, "ddp": P, "ddp_core": P}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="examples/fashion_cnn.json", help="model file [examples/fashion_cnn.json]")
    p.add_argument("--data", default="data/fashion-mnist", help="prepared dataset [data/fashion-mnist]")
    p.add_argument("--build", default="build", help="build directory [build]")
    p.add_argument("--batch", type=int, default=64, help="samples per device per step [64]")
    p.add_argument("--steps", type=int, default=300, help="timed steps per run [300]")
    p.add_argument("--warmup", type=int, default=10, help="steps before the timed ones [10]")
    p.add_argument("--rounds", type=int, default=3, help="rounds, every configuration once each [3]")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma list of {','.join(CONFIGS)} [all]")
    p.add_argument("--max-load", type=float, default=1.0,
                   help="wait before each round while the 1-minute load average is above this [1.0]")
    p.add_argument("--out", default="/tmp/crew-bench-mpi-e2e", help="run directories go here [/tmp/crew-bench-mpi-e2e]")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    p.add_argument("--json", action="store_true", help="end with one JSON line of every figure")
    a = p.parse_args()
    a.configs = [c.strip() for c in a.configs.split(",") if c.strip()]
    bad = [c for c in a.configs if c not in CONFIGS]
    if bad:
        p.error(f"unknown configuration(s) {bad}; known: {','.join(CONFIGS)}")
    for need, of in BASELINE.items():
        if need in a.configs and of not in a.configs:
            a.configs.insert(0, of)
    if a.warmup < 1 or min(a.batch, a.steps, a.rounds) < 1:
        p.error("--batch, --steps, --rounds and --warmup must be at least 1")
    if a.warmup != 10:
        p.error("--warmup: tools/bench_ddp.py warms up 10 steps (bench_torch.WARMUP_STEPS); keep 10")
    return a


log = bench_compare.log


def wait_for_quiet(limit):
    """Polls the 1-minute load average every 20 s while it is above limit, for 10 minutes at most.
    Returns (load when the wait began, load when it ended, seconds waited)."""
    first = os.getloadavg()[0]
    t0 = time.monotonic()
    while os.getloadavg()[0] > limit and time.monotonic() - t0 < 600:
        log(f"  load average {os.getloadavg()[0]:.2f} > {limit}: waiting 20 s")
        time.sleep(20)
    return first, os.getloadavg()[0], time.monotonic() - t0


def prerequisites(a):
    crew = os.path.join(ROOT, a.build, "crew")
    if not os.access(crew, os.X_OK):
        bench_compare.run(["make", "build", f"BUILD={a.build}"])
    if not os.path.isfile(os.path.join(ROOT, a.data, "manifest.json")):
        bench_compare.run([crew, "prep", "fashion-mnist", "--out", a.data])
    if any(c.startswith("crew_mpi") for c in a.configs):
        if not shutil.which("mpirun"):
            raise SystemExit("bench_mpi_e2e: mpirun not found (Debian: apt-get install openmpi-bin libopenmpi-dev)")
        if "MPI:" not in bench_compare.capture([crew, "--version"]):
            raise SystemExit(f"bench_mpi_e2e: {crew} was built without MPI (crew --version has no MPI line)")
    if os.geteuid() == 0:
        os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    os.makedirs(a.out, exist_ok=True)
    init = None
    bench = os.path.join(ROOT, a.build, "bench", "bench_train")
    if os.access(bench, os.X_OK):
        init = os.path.join(a.out, "init.safetensors")
        bench_compare.run([bench, a.model, a.data, "--batch", str(a.batch), "--steps", "1", "--devices", "1",
                           "--repeats", "1", "--save-init", init], stdout=subprocess.DEVNULL)
    return crew, init


def command(a, crew, init, cfg):
    steps = a.warmup + a.steps
    if cfg.startswith("crew"):
        devs = {"crew_1": 1, "crew_1_acc": 1, "crew_thr": P}.get(cfg, 1)
        cmd = [crew, "train", a.model, "--data", a.data, "--devices", f"cpu:{devs}",
               "--batch-per-device", str(a.batch), "--max-steps", str(steps), "--quiet", "--json",
               "--run-dir", os.path.join(a.out, cfg), "--replace", "--checkpoint-every", "100000"]
        if cfg == "crew_1_acc":
            cmd += ["--global-batch", str(P * a.batch)]
        if init:
            cmd += ["--init-weights", init]
        if cfg.startswith("crew_mpi"):
            bind = "core" if cfg.endswith("_core") else "none"
            cmd = ["mpirun", "-np", str(P), "--bind-to", bind] + cmd
        return cmd
    procs = 1 if cfg == "torch_1" else P
    cmd = [sys.executable, os.path.join(ROOT, "tools", "bench_ddp.py"), a.model, a.data, "--batch", str(a.batch),
           "--steps", str(a.steps), "--procs", str(procs), "--threads", "1", "--repeats", "1", "--json",
           "--bind", "core" if cfg == "ddp_core" else "none"]
    if init:
        cmd += ["--init-weights", init]
    return cmd


def crew_telemetry(run_dir, warmup, steps):
    """Steady samples/s and per-step means (ms, averaged over replicas) from metrics.jsonl."""
    lines = [json.loads(ln) for ln in open(os.path.join(run_dir, "metrics.jsonl")) if ln.strip()]
    st = {r["step"]: r for r in lines if r.get("type") == "step"}
    summary = [r for r in lines if r.get("type") == "summary"][-1]
    last = warmup + steps
    if warmup not in st or last not in st:
        raise SystemExit(f"{run_dir}/metrics.jsonl: steps {warmup} and {last} are not both there")
    timed = [st[i] for i in range(warmup + 1, last + 1)]
    gb = timed[0]["global_batch"]
    out = {"steady_samples_per_s": steps * gb / (st[last]["time"] - st[warmup]["time"])}
    for key in ("data_s", "forward_s", "backward_s", "comm_exposed_s", "optimizer_s"):
        out[key[:-2] + "_ms"] = 1000 * statistics.mean(statistics.mean(r[key] for r in s["replicas"]) for s in timed)
    out["step_ms"] = 1000 * statistics.mean(s["step_s"] for s in timed)
    # how unequal the replicas' compute is: mean over steps of (slowest - fastest) forward+backward
    out["compute_gap_ms"] = 1000 * statistics.mean(
        max(r["forward_s"] + r["backward_s"] for r in s["replicas"])
        - min(r["forward_s"] + r["backward_s"] for r in s["replicas"]) for s in timed)
    out["fractions"] = {k: summary[k] for k in ("data_fraction", "compute_fraction", "comm_exposed_fraction",
                                                "optimizer_fraction") if k in summary}
    return out


def run_one(a, crew, init, cfg):
    cmd = command(a, crew, init, cfg)
    log("$ " + " ".join(cmd))
    busy0, kids0, t0 = bench_compare.busy_cpu_s(), os.times(), time.monotonic()
    load = os.getloadavg()[0]
    res = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    busy1, kids1, t1 = bench_compare.busy_cpu_s(), os.times(), time.monotonic()
    if res.returncode != 0:
        raise SystemExit(f"bench_mpi_e2e: exit {res.returncode} from: {' '.join(cmd)}\n{res.stdout}{res.stderr}")
    js = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    if not js:
        raise SystemExit(f"bench_mpi_e2e: no JSON line from: {' '.join(cmd)}\n{res.stdout}{res.stderr}")
    j = json.loads(js[-1])
    r = {"samples_per_s": j["samples_per_s"], "load_1min": load, "wall_s": t1 - t0}
    if busy0 is not None and busy1 is not None:
        own = (kids1.children_user + kids1.children_system) - (kids0.children_user + kids0.children_system)
        r["background_cores"] = max(0.0, (busy1 - busy0 - own) / (t1 - t0))
    if cfg.startswith("crew"):
        r.update(crew_telemetry(os.path.join(a.out, cfg), a.warmup, a.steps))
        r["steady"] = r["steady_samples_per_s"]
    else:
        r["steady"] = j["samples_per_s"]  # bench_ddp times the steps after its warm-up only
    log(f"  -> {r['samples_per_s']:.1f} samples/s (steady {r['steady']:.1f}); load {load:.2f}; "
        f"other processes {r.get('background_cores', float('nan')):.2f} cores")
    return r


def med_range(xs):
    return statistics.median(xs), min(xs), max(xs)


def fmt(xs, digits=0):
    m, lo, hi = med_range(xs)
    return f"{m:.{digits}f} ({lo:.{digits}f}–{hi:.{digits}f})"


def summarise(a, rounds):
    table = {}
    for cfg in a.configs:
        runs = [r[cfg] for r in rounds]
        row = {"label": LABELS[cfg], "devices": DEVICES[cfg],
               "samples_per_s": [r["samples_per_s"] for r in runs], "steady": [r["steady"] for r in runs],
               "background_cores_max": max(r.get("background_cores", 0.0) for r in runs)}
        base = BASELINE.get(cfg)
        if base:
            for fig in ("samples_per_s", "steady"):
                row["eff_" + fig] = [r[cfg][fig] / (P * r[base][fig]) for r in rounds]
        if DEVICES[cfg] == P and cfg.startswith("crew") and "crew_1_acc" in a.configs:
            row["speedup_vs_acc"] = [r[cfg]["samples_per_s"] / r["crew_1_acc"]["samples_per_s"] for r in rounds]
        if cfg.startswith("crew"):
            for k in ("step_ms", "forward_ms", "backward_ms", "comm_exposed_ms", "data_ms", "compute_gap_ms"):
                row[k] = statistics.median(r[k] for r in runs)
        table[cfg] = row
    return table


def print_table(a, table, markdown):
    head = ["configuration", "samples/s (JSON)", "steady samples/s", "DP eff. (JSON)", "DP eff. (steady)",
            f"crew speed-up vs A' (global {P * a.batch})", "step ms", "fwd ms", "bwd ms", "comm exp. ms",
            "data ms", "other procs"]
    rows = []
    for cfg, r in table.items():
        crew = cfg.startswith("crew")
        rows.append([r["label"], fmt(r["samples_per_s"]), fmt(r["steady"]),
                     fmt(r["eff_samples_per_s"], 3) if "eff_samples_per_s" in r else "–",
                     fmt(r["eff_steady"], 3) if "eff_steady" in r else "–",
                     fmt(r["speedup_vs_acc"], 2) if "speedup_vs_acc" in r else "–"]
                    + ([f"{r[k]:.1f}" for k in ("step_ms", "forward_ms", "backward_ms", "comm_exposed_ms", "data_ms")]
                       if crew else ["–"] * 5)
                    + [f"≤ {r['background_cores_max']:.2f}"])
    if markdown:
        print("| " + " | ".join(head) + " |")
        print("|---|" + "--:|" * (len(head) - 1))
        for row in rows:
            print("| " + " | ".join(row) + " |")
    else:
        widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
        print("  ".join(h.ljust(w) for h, w in zip(head, widths)))
        for row in rows:
            print("  ".join(c.ljust(w) for c, w in zip(row, widths)))
    print(f"\nmedian (min–max) of {a.rounds} rounds; {a.steps} timed steps after {a.warmup} warm-up steps; "
          f"batch {a.batch} per device. DP eff. = P-device samples/s / ({P} x the 1-device baseline's), per round. "
          "crew's telemetry columns: per-step means over the timed steps, averaged over replicas; "
          "other procs: the most CPU (cores) other processes used during any of the row's runs.")


def main():
    a = parse_args()
    crew, init = prerequisites(a)
    info = bench_compare.machine_info(crew)
    info["load_before"] = bench_compare.loadavg()
    rounds, waits = [], []
    for i in range(a.rounds):
        order = a.configs if i % 2 == 0 else list(reversed(a.configs))
        w = wait_for_quiet(a.max_load)
        waits.append({"round": i + 1, "load_before_wait": round(w[0], 2), "load_at_start": round(w[1], 2),
                      "waited_s": round(w[2])})
        log(f"round {i + 1}/{a.rounds} (load average {w[1]:.2f} after waiting {w[2]:.0f} s): {', '.join(order)}")
        rounds.append({cfg: run_one(a, crew, init, cfg) for cfg in order})
    info["load_after"] = bench_compare.loadavg()
    table = summarise(a, rounds)
    print(f"{os.path.basename(a.model)}: {info['cpu']}, {info['cores']} CPUs; crew {info['crew']}, "
          f"GEMM {info['gemm']}; {info['date']}; load before {info['load_before']}, after {info['load_after']}")
    print_table(a, table, a.markdown)
    if a.json:
        print(json.dumps({"machine": info, "waits": waits, "args": {k: v for k, v in vars(a).items()},
                          "rounds": rounds, "table": table}))


if __name__ == "__main__":
    main()
