#!/usr/bin/env python3
"""The CPU's GEMM libraries at the example models' shapes: oneDNN's sgemm (crew's on x86-64) and
OpenBLAS's (crew's elsewhere), from bench/bench_gemm, against PyTorch's (torch.addmm: MKL in
PyPI's x86 wheels) measured in the same run on the same core.

    python3 tools/bench_gemm.py [--bench build/bench/bench_gemm] [--threads 1] [--rounds 5]
                                [--model mlp|cnn|gpt] [--markdown]

bench_gemm times both C libraries in alternating rounds and prints its shapes as JSON; this script
then times torch.addmm(c, a, b, out=c) at each shape (the same c += op(a)·op(b), transposes as
views of the stored operands) the same way: calls for about 20 ms a round, the median round.
Everything runs pinned to one core per thread (bench_compare.pick_cores). Prints GFLOP/s per shape
and each model's GEMM milliseconds a training step by each library, PyTorch's as the peer: the
ratio column is the library's step time over PyTorch's.
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


def torch_gflops(torch, s, rounds):
    """Median GFLOP/s of torch.addmm at shape s over `rounds` rounds of about 20 ms."""
    m, n, k = s["m"], s["n"], s["k"]
    a = torch.rand(k, m).t() if s["trans_a"] else torch.rand(m, k)
    b = torch.rand(n, k).t() if s["trans_b"] else torch.rand(k, n)
    c = torch.rand(m, n)
    flops = 2.0 * m * n * k
    reps = max(3, int(20e-3 * 100e9 / flops))
    torch.addmm(c, a, b, out=c)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(reps):
            torch.addmm(c, a, b, out=c)
        times.append((time.perf_counter() - t0) / reps)
    return flops / statistics.median(times) / 1e9


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bench", default=os.path.join(ROOT, "build", "bench", "bench_gemm"))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--model", choices=["mlp", "cnn", "gpt"])
    p.add_argument("--markdown", action="store_true")
    a = p.parse_args()
    if not os.path.exists(a.bench):
        sys.exit(f"bench_gemm: {a.bench} is not built (a oneDNN build with OpenBLAS installed builds it)")
    try:
        import torch
    except ImportError:
        sys.exit("bench_gemm: PyTorch is not installed (pip install torch): it is the peer")
    cores = bench_compare.pick_cores(a.threads)
    if not cores:
        sys.exit(f"bench_gemm: this process may use fewer than {a.threads} CPUs")
    cmd = [a.bench, "--threads", str(a.threads), "--rounds", str(a.rounds), "--json"]
    if a.model:
        cmd += ["--model", a.model]
    out = subprocess.run(["taskset", "-c", ",".join(map(str, cores))] + cmd, check=True, capture_output=True,
                         text=True).stdout
    figures = json.loads(out.strip().splitlines()[-1])
    os.sched_setaffinity(0, cores)
    torch.set_num_threads(a.threads)
    for s in figures["shapes"]:
        s["PyTorch"] = torch_gflops(torch, s, a.rounds)
    libs = ["oneDNN", "OpenBLAS", "PyTorch"]
    print(out.splitlines()[0])
    print(f"PyTorch {torch.__version__} torch.addmm, {a.threads} thread(s), {bench_compare.describe_cores(cores)}\n")
    head = ["model", "GEMM", "m", "n", "k", "a step"] + [f"{lib} GF/s" for lib in libs]
    rows = [[s["model"], s["name"], s["m"], s["n"], s["k"], s["count"]] + [f"{s[lib]:.1f}" for lib in libs]
            for s in figures["shapes"]]
    sep = " | " if a.markdown else "  "
    if a.markdown:
        print("| " + " | ".join(map(str, head)) + " |")
        print("|" + "|".join(["---"] * 2 + ["--:"] * (len(head) - 2)) + "|")
    else:
        print(sep.join(f"{h:>12}" for h in head))
    for r in rows:
        print(("| " + " | ".join(map(str, r)) + " |") if a.markdown else sep.join(f"{str(c):>12}" for c in r))
    print("\nGEMM milliseconds a training step, and over PyTorch's:")
    for model in ["mlp", "cnn", "gpt"]:
        shapes = [s for s in figures["shapes"] if s["model"] == model]
        if not shapes:
            continue
        ms = {lib: 1e3 * sum(2.0 * s["m"] * s["n"] * s["k"] * s["count"] / (s[lib] * 1e9) for s in shapes)
              for lib in libs}
        print(f"  {model}: " + ", ".join(f"{lib} {ms[lib]:.2f} ({ms[lib] / ms['PyTorch']:.2f}x)" for lib in libs))
    others = figures["other_cores"]  # -1: unknown (a run too short to tell, bench/bench_machine.h)
    print("other processes kept " + (f"{others:.2f} cores" if others >= 0 else "an unknown number of cores")
          + " busy during bench_gemm")


if __name__ == "__main__":
    main()
