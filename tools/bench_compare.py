#!/usr/bin/env python3
"""Training throughput of crew against PyTorch on this machine, in one command.

    python3 tools/bench_compare.py [--markdown] [--json] [--data DIR] [--build DIR] [--rounds 5] [--scaling 4,8]
    python3 tools/bench_compare.py --against OLD_BUILD [--markdown] [--rounds 7] [--models mlp,cnn]

For the MLP and the CNN of examples/ it runs (each a median of --repeats timed runs, all from the
same initial weights):

  crew  --devices 2                          2 replicas x 1 GEMM thread, B/2 per replica
  crew  --devices 2 --shard-optimizer        the same, the optimizer sharded (the same bits)
  crew  --devices 1 --threads-per-device 2   1 replica, 2 GEMM threads
  crew  --devices 1                          1 replica, 1 thread
  torch 2 threads, torch 1 thread            tools/bench_torch.py, same weights, optimizer, data
  crew  --devices 2 at batch 2B              for the data-parallel scaling efficiency, in --rounds
                                             rounds paired with crew --devices 1 on one core, in
                                             the faster of the two 2-replica layouts above
  2 x crew --devices 1, one per core, at once   the ceiling: what 2 replicas that cost each other
                                             nothing would reach (in the same rounds)

and prints samples/s, the crew/PyTorch ratios at equal thread counts and each at its best, the
scaling efficiency at a fixed per-device batch and against the ceiling of two independent
processes, and whether the targets of docs/PERFORMANCE.md are met. The figures are
what docs/PERFORMANCE.md explains.

--against OLD_BUILD measures this build (--build) against another build of crew instead (a build
directory of an older commit, with its bench/bench_train): for each model and each layout (1
replica, 2 replicas, 1 replica x 2 BLAS threads) it runs --rounds rounds of one timed run of each
build, right after each other and in alternating order, from the same initial weights, and prints
each round's new/old ratio, their median, and a verdict: slower (or faster) beyond the noise only
when every round says so, else within the noise. No PyTorch is needed.

Every figure runs under taskset on two cores that are not hyperthreads of one physical core (the
first two such cores this process may use), and the one-core baseline on the first of them, so a
machine with more cores measures what a 2-core machine would. --scaling N,... adds the
data-parallel efficiency of N replicas on N such cores, where the machine has them.
"""
import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name, model file, global batch, default steps (a few seconds per timed run on 2 cores)
MODELS = [
    ("mlp", "examples/fashion_mlp.json", 128, 300),
    ("cnn", "examples/fashion_cnn.json", 64, 60),
]
# Targets. Issue 12: crew / PyTorch at the same thread count, and data-parallel efficiency. Issue 17,
# as issue 36 restated them: crew at its best 2-thread layout / PyTorch at its best thread count,
# and the 2 replicas' throughput against the ceiling of two independent one-replica processes, one
# per core.
TARGETS = {"mlp_ratio": 1.5, "cnn_ratio": 1.0, "cnn_dp_efficiency": 0.90,
           "mlp_ratio_best": 2.5, "cnn_ratio_best": 2.0, "mlp_dp_vs_ceiling": 0.90, "cnn_dp_vs_ceiling": 0.95}
FIGURES = ["crew_1", "crew_dp2", "crew_dp2_shard", "crew_blas2", "torch_2", "torch_1", "crew_dp2_fixed",
           "crew_1_one_core"]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--markdown", action="store_true", help="print the results as Markdown tables")
    p.add_argument("--json", action="store_true", help="print all figures as one JSON line (last line)")
    p.add_argument("--data", default="data/fashion-mnist", help="prepared dataset [data/fashion-mnist]")
    p.add_argument("--build", default="build", help="build directory [build]")
    p.add_argument("--mlp-steps", type=int, default=MODELS[0][3], help=f"timed steps, MLP [{MODELS[0][3]}]")
    p.add_argument("--cnn-steps", type=int, default=MODELS[1][3], help=f"timed steps, CNN [{MODELS[1][3]}]")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per figure; the median counts [3]")
    p.add_argument("--models", default="mlp,cnn", help="which models, a comma list of mlp and cnn [mlp,cnn]")
    p.add_argument("--rounds", type=int, default=5,
                   help="paired rounds (one replica, then N) behind each data-parallel efficiency [5]")
    p.add_argument("--scaling", default="", help="also N replicas on N cores, for each N of a comma list (e.g. 4,8)")
    p.add_argument("--against", default="", metavar="OLD_BUILD",
                   help="compare this build with the build directory OLD_BUILD, in paired rounds (no PyTorch)")
    a = p.parse_args()
    try:
        a.scaling = [int(n) for n in a.scaling.split(",") if n.strip()]
    except ValueError:
        p.error(f"--scaling takes a comma list of replica counts, got '{a.scaling}'")
    a.models = [m.strip() for m in a.models.split(",") if m.strip()]
    if not a.models or any(m not in [name for name, *_ in MODELS] for m in a.models):
        p.error(f"--models takes a comma list of {', '.join(name for name, *_ in MODELS)}")
    if a.rounds < 1 or a.repeats < 1:
        p.error("--rounds and --repeats must be at least 1")
    if any(n < 2 for n in a.scaling):
        p.error("--scaling counts must be at least 2")
    return a


def siblings(cpu):
    """The logical CPUs that share cpu's physical core (cpu itself included)."""
    try:
        with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") as f:
            text = f.read().strip()
    except OSError:
        return {cpu}
    out = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def pick_cores(n):
    """n logical CPUs this process may use, on distinct physical cores where there are enough, else
    filled up with hyperthread siblings; None when the process may use fewer than n CPUs."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < n:
        return None
    chosen, taken = [], set()
    for cpu in allowed:
        if len(chosen) < n and cpu not in taken:
            chosen.append(cpu)
            taken |= siblings(cpu)
    chosen += [cpu for cpu in allowed if cpu not in chosen][: n - len(chosen)]
    return sorted(chosen)


def pinned(cores):
    """The command prefix that runs a program on these cores (none without taskset)."""
    if not shutil.which("taskset"):
        return []
    return ["taskset", "-c", ",".join(str(c) for c in cores)]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run(cmd, **kw):
    log("$ " + " ".join(cmd))
    return subprocess.run(cmd, cwd=ROOT, check=True, **kw)


def ensure_prerequisites(a):
    crew = os.path.join(ROOT, a.build, "crew")
    bench = os.path.join(ROOT, a.build, "bench", "bench_train")
    if not (os.access(crew, os.X_OK) and os.access(bench, os.X_OK)):
        run(["make", "build", f"BUILD={a.build}"])
    if not os.path.isfile(os.path.join(ROOT, a.data, "manifest.json")):
        run([crew, "prep", "fashion-mnist", "--out", a.data])
    return crew, bench


def busy_cpu_s():
    """CPU seconds the whole machine has spent busy since boot (/proc/stat), or None."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def last_json(cmd):
    """Runs a benchmark with --json and returns its last line, parsed, with background_cores added:
    the CPU that other processes used meanwhile (machine busy time minus the benchmark's own, per
    second of wall time), so that figures disturbed by a shared machine can be recognised."""
    log("$ " + " ".join(cmd))
    busy0, kids0, t0 = busy_cpu_s(), os.times(), time.monotonic()
    out = subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.PIPE, text=True).stdout
    busy1, kids1, t1 = busy_cpu_s(), os.times(), time.monotonic()
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if not lines:
        raise SystemExit(f"bench_compare: no JSON line from: {' '.join(cmd)}\n{out}")
    r = json.loads(lines[-1])
    if busy0 is not None and busy1 is not None:
        own = (kids1.children_user + kids1.children_system) - (kids0.children_user + kids0.children_system)
        r["background_cores"] = round(max(0.0, (busy1 - busy0 - own) / (t1 - t0)), 3)
    log(f"  -> {r['samples_per_s']:.1f} samples/s (min {r['samples_per_s_min']:.1f}, "
        f"max {r['samples_per_s_max']:.1f}); other processes used {r.get('background_cores', '?')} cores")
    return r


def concurrent_json(cmds):
    """Runs the benchmarks at the same time (each with --json) and returns their last JSON lines."""
    for cmd in cmds:
        log("$ " + " ".join(cmd) + " &")
    procs = [subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True) for cmd in cmds]
    out = []
    for cmd, proc in zip(cmds, procs):
        text, _ = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"bench_compare: exit {proc.returncode} from: {' '.join(cmd)}")
        lines = [ln for ln in text.splitlines() if ln.startswith("{")]
        if not lines:
            raise SystemExit(f"bench_compare: no JSON line from: {' '.join(cmd)}")
        out.append(json.loads(lines[-1]))
    log("  -> " + " + ".join(f"{r['samples_per_s']:.1f}" for r in out) + " samples/s side by side")
    return out


def run_records(run_dir):
    """A crew run directory's metrics.jsonl: its "run" record (the plan) and its step records."""
    plan, steps = {}, []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if r.get("type") == "run":
                plan = r
            elif r.get("type") == "step":
                steps.append(r)
    return plan, steps


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else sum(xs[len(xs) // 2 - 1: len(xs) // 2 + 1]) / 2


def paired_efficiency(a, baseline_cmd, replicas_cmd, n, independent_cmds=None):
    """Data-parallel efficiency as the median over --rounds of paired runs: each round times one
    replica on one core, then n replicas on n cores, right after each other. On a machine whose
    speed drifts (other tenants, clock boost) both halves of a ratio see much the same machine,
    so the median ratio is steadier than a ratio of two medians taken minutes apart.

    independent_cmds (one per core): each round then also runs n independent one-replica
    processes at once, one pinned to each core, the ceiling that n replicas of one run could reach
    if they cost each other nothing (they share only the machine: memory bandwidth, caches, clock
    boost). Returned as the ceiling's own efficiency (their sum / n x the baseline) and the
    replicas' throughput against it (the median per round of replicas / their sum)."""
    base, reps, ratios, ceilings, vs_ceiling = [], [], [], [], []
    for _ in range(a.rounds):
        base.append(last_json(baseline_cmd))
        reps.append(last_json(replicas_cmd))
        ratios.append(reps[-1]["samples_per_s"] / (n * base[-1]["samples_per_s"]))
        if independent_cmds:
            together = sum(r["samples_per_s"] for r in concurrent_json(independent_cmds))
            ceilings.append(together / (n * base[-1]["samples_per_s"]))
            vs_ceiling.append(reps[-1]["samples_per_s"] / together)
    median_run = lambda runs: sorted(runs, key=lambda f: f["samples_per_s"])[len(runs) // 2]  # noqa: E731
    eff = median(ratios)
    log(f"  efficiency of {n} replicas, paired rounds: " + ", ".join(f"{x:.2f}" for x in ratios)
        + f" -> median {eff:.2f}")
    out = {"efficiency": eff, "rounds": [round(x, 4) for x in ratios],
           "replicas_run": median_run(reps), "baseline_run": median_run(base)}
    if independent_cmds:
        log(f"  {n} independent processes against one alone: " + ", ".join(f"{x:.2f}" for x in ceilings)
            + "; the replicas against them: " + ", ".join(f"{x:.2f}" for x in vs_ceiling))
        out.update(ceiling=median(ceilings), ceiling_rounds=[round(x, 4) for x in ceilings],
                   vs_ceiling=median(vs_ceiling), vs_ceiling_rounds=[round(x, 4) for x in vs_ceiling])
    return out


def bench_model(a, bench, name, model, batch, steps, init):
    common = [model, a.data, "--steps", str(steps), "--repeats", str(a.repeats), "--json"]
    common_one = [model, a.data, "--steps", str(steps), "--repeats", "1", "--json"]
    two, one = pinned(a.cores), pinned(a.cores[:1])
    crew = lambda *extra: last_json(two + [bench] + common + list(extra))  # noqa: E731
    torch = lambda t: last_json(two + [sys.executable, "tools/bench_torch.py"] + common  # noqa: E731
                                + ["--batch", str(batch), "--threads", str(t), "--init-weights", init])
    r = {"model": os.path.splitext(os.path.basename(model))[0], "batch": batch, "steps": steps}
    # The first run writes the initial weights every other run (and PyTorch) starts from.
    r["crew_1"] = crew("--batch", str(batch), "--devices", "1", "--save-init", init)
    r["crew_dp2"] = crew("--batch", str(batch), "--devices", "2", "--init-weights", init)
    # The optimizer sharded across the 2 replicas (the same bits; crew train's measured layout picks it
    # where it is faster): the replicas' layout of the paired rounds below is the faster of the two.
    r["crew_dp2_shard"] = crew("--batch", str(batch), "--devices", "2", "--shard-optimizer", "--init-weights", init)
    r["crew_blas2"] = crew("--batch", str(batch), "--devices", "1", "--threads-per-device", "2",
                           "--init-weights", init)
    r["torch_2"] = torch(2)
    r["torch_1"] = torch(1)
    # Fixed per-device batch: N replicas x `batch` on N cores against 1 replica x `batch` on ONE core
    # (so the baseline's loader threads share its core instead of borrowing another).
    base_args = common_one + ["--batch", str(batch), "--devices", "1", "--init-weights", init]
    sharded = r["crew_dp2_shard"]["samples_per_s"] > r["crew_dp2"]["samples_per_s"]
    r["dp_layout"] = "optimizer sharded" if sharded else "replicas"
    dp2 = paired_efficiency(a, one + [bench] + base_args,
                            two + [bench] + common_one + ["--batch", str(2 * batch), "--devices", "2",
                                                          "--init-weights", init]
                            + (["--shard-optimizer"] if sharded else []), 2,
                            [pinned([c]) + [bench] + base_args for c in a.cores])
    r["crew_dp2_fixed"], r["crew_1_one_core"] = dp2["replicas_run"], dp2["baseline_run"]
    r["dp_efficiency"], r["dp_efficiency_rounds"] = dp2["efficiency"], dp2["rounds"]
    r["ceiling"], r["ceiling_rounds"] = dp2["ceiling"], dp2["ceiling_rounds"]
    r["dp_vs_ceiling"], r["dp_vs_ceiling_rounds"] = dp2["vs_ceiling"], dp2["vs_ceiling_rounds"]
    r["scaling"] = []
    for n in a.scaling:
        cores = pick_cores(n)
        if cores is None:
            log(f"  (skipping {n} replicas: this process may use only {len(os.sched_getaffinity(0))} cores)")
            continue
        e = paired_efficiency(a, one + [bench] + base_args,
                              pinned(cores) + [bench] + common_one + ["--batch", str(n * batch), "--devices", str(n),
                                                                      "--init-weights", init], n)
        f = dict(e["replicas_run"], replicas=n, cores=cores, efficiency=e["efficiency"],
                 efficiency_rounds=e["rounds"])
        r["scaling"].append(f)
    sps = lambda k: r[k]["samples_per_s"]  # noqa: E731
    r["crew_best_2"] = max(("crew_dp2", "crew_dp2_shard", "crew_blas2"), key=sps)
    r["ratio_2_threads"] = sps(r["crew_best_2"]) / sps("torch_2")
    r["ratio_1_thread"] = sps("crew_1") / sps("torch_1")
    r["torch_best"] = "torch_2" if sps("torch_2") >= sps("torch_1") else "torch_1"
    r["ratio_best"] = sps(r["crew_best_2"]) / sps(r["torch_best"])  # both at their best on the 2 cores
    bg = [r[k].get("background_cores") for k in FIGURES if r[k].get("background_cores") is not None]
    r["background_cores_max"] = max(bg) if bg else None
    return r


def capture(cmd):
    try:
        return subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def blas_version(version_text):
    """The CPU's GEMM library from crew --version's BLAS line: 'oneDNN 2.6.3 (instruction sets up to
    AVX512_CORE)', or in an OpenBLAS build 'OpenBLAS 0.3.21 (kernels for Zen)'."""
    for line in version_text.splitlines():
        if line.startswith("BLAS: oneDNN "):
            words, _, isa = line[len("BLAS: "):].partition(" sgemm, ")
            return f"{words} ({isa})" if isa else words
        if line.startswith("BLAS: OpenBLAS "):
            words, _, core = line[len("BLAS: OpenBLAS "):].partition(", kernels for ")
            return f"OpenBLAS {words.split()[0]} (kernels for {core})" if words else "unknown"
    return "unknown"


def machine_info(crew):
    cpu = "unknown"
    for line in capture(["lscpu"]).splitlines():
        if line.startswith("Model name:"):
            cpu = line.split(":", 1)[1].strip()
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "kernel": platform.release(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "crew": capture([crew, "--version"]).splitlines()[0].replace("crew ", ""),
        "gemm": blas_version(capture([crew, "--version"])),
        "python": platform.python_version(),
    }


def describe_cores(cores):
    shared = any(c in siblings(cores[0]) for c in cores[1:])
    return (f"CPUs {','.join(str(c) for c in cores)}"
            + (" (hyperthreads of one core)" if shared else ""))


def judge(results):
    """Each target against the figures: (label, target, value, met)."""
    rows = []
    for key, label in (("mlp", "MLP"), ("cnn", "CNN")):
        if key not in results:
            continue
        r, t = results[key], TARGETS[f"{key}_ratio"]
        rows.append((f"{label} crew/PyTorch, 2 threads", t, r["ratio_2_threads"]))
        rows.append((f"{label} crew/PyTorch, 1 thread", t, r["ratio_1_thread"]))
    if "cnn" in results:
        rows.append(("CNN data-parallel efficiency", TARGETS["cnn_dp_efficiency"], results["cnn"]["dp_efficiency"]))
    for key, label in (("mlp", "MLP"), ("cnn", "CNN")):  # issue 17's, as issue 36 restated them
        if key in results:
            rows.append((f"{label} crew best / PyTorch best, 2 cores", TARGETS[f"{key}_ratio_best"],
                         results[key]["ratio_best"]))
            rows.append((f"{label} 2 replicas / 2 independent processes", TARGETS[f"{key}_dp_vs_ceiling"],
                         results[key]["dp_vs_ceiling"]))
    return [(label, t, v, v >= t) for label, t, v in rows]


def figure_rows(results):
    head = ["model", "batch", "crew 2 dev x 1 thr", "crew 2 dev, sharded", "crew 1 dev x 2 thr", "torch 2 thr",
            "crew/torch 2 thr", "crew 1 thr", "torch 1 thr", "crew/torch 1 thr", "DP eff.", "ceiling",
            "DP/ceiling", "other procs"]
    rows = []
    for r in results.values():
        s = lambda k: f"{r[k]['samples_per_s']:.0f}"  # noqa: E731
        best = lambda k: ("**" + s(k) + "**") if r["crew_best_2"] == k else s(k)  # noqa: E731
        rows.append([f"{r['model']} ({r['steps']} steps)", str(r["batch"]), best("crew_dp2"), best("crew_dp2_shard"), best("crew_blas2"),
                     s("torch_2"), f"{r['ratio_2_threads']:.2f}x", s("crew_1"), s("torch_1"),
                     f"{r['ratio_1_thread']:.2f}x", f"{r['dp_efficiency']:.2f}", f"{r['ceiling']:.2f}",
                     f"{r['dp_vs_ceiling']:.2f}",
                     "?" if r["background_cores_max"] is None else f"≤ {r['background_cores_max']:.2f} cores"])
    return head, rows


def print_markdown(info, results, targets, command):
    print(f"Machine: {info['cpu']}, {info['cores']} cores; {info['date']}; crew {info['crew']}, "
          f"PyTorch {info['torch']}, GEMM {info['gemm']}; load average before/after "
          f"{info['load_before']} / {info['load_after']}.  ")
    print(f"Command: `{command}`. Figures are samples/s, median of {info['repeats']} timed runs "
          f"(bold: crew's better 2-thread layout), every run on {info['cores_used']}, the one-core "
          f"baseline on the first; sharded: the optimizer sharded across the 2 replicas (--shard-optimizer); "
          f"DP eff. at a fixed per-device batch, the median of {info['rounds']} paired "
          f"rounds (one replica on one core, then two on two, in the faster of the two 2-replica layouts: "
          + ", ".join(f"{r['model']} {r['dp_layout']}" for r in results.values()) + "); ceiling: two independent one-replica "
          f"processes side by side, one per core, against one alone, and DP/ceiling the 2 replicas "
          f"against those two (medians of the same rounds); other procs: the "
          f"most CPU other processes used during any of the row's figures.\n")
    head, rows = figure_rows(results)
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" if i == 0 else "--:" for i in range(len(head))) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print("\nCommunication per step of the 2-replica runs at a fixed per-device batch (crew's own telemetry):\n")
    # data: waiting for loader threads, or, where each replica prepares its own batches (every core
    # computes: docs/DATA.md), the time it takes
    print("| model | all-reduce exposed (ms) | exposed share of the step | hidden behind backward (ms) | data (wait or own prep) |")
    print("|---|--:|--:|--:|--:|")
    for r in results.values():
        f = r["crew_dp2_fixed"]
        print(f"| {r['model']} | {f.get('comm_exposed_ms', float('nan')):.3f} | "
              f"{100 * f.get('comm_exposed_fraction', float('nan')):.1f}% | {f.get('comm_hidden_ms', float('nan')):.3f} | "
              f"{100 * f.get('data_fraction', float('nan')):.1f}% |")
    if any(r["scaling"] for r in results.values()):
        print("\nData-parallel scaling at a fixed per-device batch, N replicas on N cores against one replica "
              "on one core:\n")
        print("| model | replicas | cores | samples/s | efficiency | all-reduce exposed | data wait |")
        print("|---|--:|---|--:|--:|--:|--:|")
        for r in results.values():
            for f in r["scaling"]:
                print(f"| {r['model']} | {f['replicas']} | {','.join(str(c) for c in f['cores'])} | "
                      f"{f['samples_per_s']:.0f} | {f['efficiency']:.2f} | "
                      f"{100 * f.get('comm_exposed_fraction', float('nan')):.1f}% | "
                      f"{100 * f.get('data_fraction', float('nan')):.1f}% |")
    print("\n| target | wanted | measured | met |\n|---|--:|--:|---|")
    for label, t, v, met in targets:
        print(f"| {label} | ≥ {t:.2f} | {v:.3f} | {'yes' if met else '**no**'} |")


def print_text(info, results, targets):
    print(f"machine: {info['cpu']}, {info['cores']} cores   date: {info['date']}")
    print(f"crew {info['crew']}   torch {info['torch']}   GEMM {info['gemm']}   "
          f"load avg before/after: {info['load_before']} / {info['load_after']}   runs on {info['cores_used']}")
    head, rows = figure_rows(results)
    widths = [max(len(h), *(len(r[i].strip('*')) for r in rows)) for i, h in enumerate(head)]
    print("  ".join(h.rjust(w) for h, w in zip(head, widths)))
    for row in rows:
        print("  ".join(c.strip("*").rjust(w) for c, w in zip(row, widths)))
    for r in results.values():
        for f in r["scaling"]:
            print(f"{r['model']} data-parallel efficiency, {f['replicas']} replicas on {f['replicas']} cores: "
                  f"{f['efficiency']:.2f} ({f['samples_per_s']:.0f} samples/s)")
    for label, t, v, met in targets:
        print(f"{label:34s} wanted >= {t:.2f}  measured {v:.3f}  {'met' if met else 'NOT met'}")


# --against: the layouts measured, as bench_train flags.
LAYOUTS = [("1 replica", ["--devices", "1"]), ("2 replicas", ["--devices", "2"]),
           ("1 replica x 2 threads", ["--devices", "1", "--threads-per-device", "2"])]


def against_model(a, new_bench, old_bench, model, batch, steps, init):
    """Paired rounds of both builds for every layout of one model."""
    two = pinned(a.cores)
    common = [model, a.data, "--steps", str(steps), "--repeats", "1", "--json", "--batch", str(batch)]
    # The new build writes the initial weights that every run of both builds starts from.
    last_json(two + [new_bench] + common + ["--devices", "1", "--save-init", init])
    rows = []
    for label, flags in LAYOUTS:
        runs = {"new": [], "old": []}
        ratios = []
        for r in range(a.rounds):
            order = ("old", "new") if r % 2 == 0 else ("new", "old")  # alternating: drift cancels out
            got = {}
            for which in order:
                exe = new_bench if which == "new" else old_bench
                got[which] = last_json(two + [exe] + common + flags + ["--init-weights", init])["samples_per_s"]
                runs[which].append(got[which])
            ratios.append(got["new"] / got["old"])
        med = lambda xs: sorted(xs)[len(xs) // 2] if len(xs) % 2 else \
            sum(sorted(xs)[len(xs) // 2 - 1: len(xs) // 2 + 1]) / 2  # noqa: E731
        verdict = ("slower beyond the noise" if max(ratios) < 1 else
                   "faster beyond the noise" if min(ratios) > 1 else "within the noise")
        log(f"  {label}: new/old per round " + ", ".join(f"{x:.3f}" for x in ratios) + f" -> {verdict}")
        rows.append({"layout": label, "old": med(runs["old"]), "new": med(runs["new"]), "ratio": med(ratios),
                     "lo": min(ratios), "hi": max(ratios), "rounds": [round(x, 4) for x in ratios],
                     "verdict": verdict})
    return rows


def main_against(a):
    new_bench = os.path.join(ROOT, a.build, "bench", "bench_train")
    old_bench = os.path.join(a.against, "bench", "bench_train")
    for exe in (new_bench, old_bench):
        if not os.access(exe, os.X_OK):
            raise SystemExit(f"bench_compare: no {exe}: build it first")
    crew, _ = ensure_prerequisites(a)
    info = machine_info(crew)
    steps = {"mlp": a.mlp_steps, "cnn": a.cnn_steps}
    tmp = tempfile.mkdtemp(prefix="bench_compare.")
    load_before = loadavg()
    try:
        results = {name: against_model(a, new_bench, old_bench, model, batch, steps[name],
                                       os.path.join(tmp, f"{name}_init.safetensors"))
                   for name, model, batch, _ in MODELS if name in a.models}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    command = "python3 tools/bench_compare.py " + " ".join(sys.argv[1:])
    print(f"Machine: {info['cpu']}, {info['cores']} cores; {info['date']}; GEMM {info['gemm']}; every run on "
          f"{describe_cores(a.cores)}; load average before/after {load_before} / {loadavg()}.  ")
    print(f"Command: `{command.strip()}`. samples/s are medians over {a.rounds} paired rounds (one timed run of "
          f"each build per round, alternating which goes first); new = {a.build}, old = {a.against}.\n")
    print("| model | layout | old samples/s | new samples/s | new/old (median) | rounds (lowest–highest) | verdict |")
    print("|---|---|--:|--:|--:|--:|---|")
    for name, rows in results.items():
        for r in rows:
            print(f"| {name} | {r['layout']} | {r['old']:.0f} | {r['new']:.0f} | {r['ratio']:.3f} | "
                  f"{r['lo']:.3f}–{r['hi']:.3f} | {r['verdict']} |")
    if a.json:
        print(json.dumps({"machine": info, "command": command.strip(), "against": a.against, "results": results}))


def loadavg():
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main():
    a = parse_args()
    a.cores = pick_cores(2)
    if a.cores is None:
        raise SystemExit("bench_compare: this process may use only one core; the comparisons need two")
    if a.against:
        return main_against(a)
    crew, bench = ensure_prerequisites(a)
    info = machine_info(crew)
    info["cores_used"] = describe_cores(a.cores)
    info["load_before"] = loadavg()
    info["repeats"] = a.repeats
    info["rounds"] = a.rounds
    steps = {"mlp": a.mlp_steps, "cnn": a.cnn_steps}
    tmp = tempfile.mkdtemp(prefix="bench_compare.")
    try:
        results = {name: bench_model(a, bench, name, model, batch, steps[name],
                                     os.path.join(tmp, f"{name}_init.safetensors"))
                   for name, model, batch, _ in MODELS if name in a.models}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    info["load_after"] = loadavg()
    info["torch"] = next(iter(results.values()))["torch_1"]["torch_version"]
    targets = judge(results)
    command = "python3 tools/bench_compare.py " + " ".join(sys.argv[1:])
    if a.markdown:
        print_markdown(info, results, targets, command.strip())
    else:
        print_text(info, results, targets)
    if a.json:
        print(json.dumps({"machine": info, "command": command.strip(), "results": results,
                          "targets": [{"what": l, "wanted": t, "measured": round(v, 4), "met": m}
                                      for l, t, v, m in targets]}))


if __name__ == "__main__":
    main()
