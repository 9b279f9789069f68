#!/usr/bin/env python3
"""gpt_tiny's training tokens/s of crew's fully sharded data parallelism (ZeRO-3, `--shard
parameters`) against PyTorch's FSDP2 (`fully_shard`) on the same two CPU cores, side by side in one
run, and their ratio (the target: crew / FSDP2 >= 1.5x).

    python3 tools/bench_fsdp.py [--crew build/crew] [--text FILE] [--steps 30] [--warmup 5]
                                [--rounds 1] [--idle 0.25] [--markdown] [--json]

(python3 being a Python with torch and numpy: the two PyTorch contestants run under the same
interpreter as this script.)

The model, the data and the optimizer are tools/bench_gpt.py's, imported rather than copied:
examples/gpt_tiny.json read on both sides (GPT-2's block, 4 blocks, width 128, context 128, LM head
tied to the token embedding), a global batch of 32 windows of 128 byte tokens per optimizer step,
AdamW with the file's lr, betas, eps and weight decay, its warmup and cosine schedule, clipping at
its clip_norm; the text (--text, default data/kjv.txt) prepared by `crew prep text --seq-len 128`.
Contestants, all under taskset on the same two cores (bench_compare.py's choice):

  crew   --devices cpu:2 --shard parameters   ZeRO-3: 2 replicas x 1 GEMM thread, 16 windows
                                              each; each keeps half the parameters, gradients and
                                              optimizer state, units gathered and reduce-scattered
  crew   --devices cpu:2                      the same replicas unsharded (context)
  torch  FSDP2, 2 processes                   gloo process group of 2, torch.set_num_threads(1)
                                              each; fully_shard on each block, then on the root
                                              (embeddings, final LayerNorm, the tied head):
                                              parameters resharded after forward, gradients
                                              reduce-scattered, i.e. ZeRO-3; 16 windows per rank
  torch  DDP, 2 processes                     the same group, DistributedDataParallel's defaults
                                              (gradients all-reduced in buckets during backward)

Both PyTorch contestants start from the same weights on both ranks (seed 1), draw the global
batches as bench_gpt.py does (so they train the windows its single-process PyTorch trains), each
rank taking its 16 of every 32, and use fused AdamW where this torch has it on the CPU (also on
FSDP2's DTensor parameters), else foreach AdamW. FSDP2 does run on the CPU with gloo (checked with
torch 2.15: its losses match DDP's to 1e-6); were fully_shard to fail on some other torch (not
there, or a collective gloo lacks), the FSDP2 row says "failed", the output says "FSDP2 does not
run on CPU here: <the error>; measured against DDP instead", and the ratio is taken against DDP.

Each contestant is its own process (PyTorch's: a launcher and its 2 rank processes): --warmup
steps, then --steps timed steps. Its figure is the median step time of the timed steps: crew's
`step_s` from the step records of its metrics.jsonl, PyTorch's from a clock on each rank around
forward, backward, clipping and the update, started after a barrier (the batches are cut before
the loop), the slower rank's time for each step. tokens/s = 32 x 128 / that median. With --rounds
R every contestant runs R times, in turns; its figure is the median over the rounds in which other
processes kept at most 0.25 cores busy, or, where none was that quiet, the least disturbed round.
Before each contestant the machine is sampled as bench_gpt.py does (--idle, --idle-wait), and the
"other procs" column says how many cores other processes kept busy during the runs that count.

Output: the machine (CPU model, cores, the two used), the date, crew's and torch's versions, the
command, the table (contestant, layout, ms/step, tokens/s, ratio to FSDP2, other procs), and last
`crew ZeRO-3 / FSDP2: X.XXx (target 1.5x)`. --markdown prints it as Markdown; --json adds one JSON
line of all figures.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_compare  # noqa: E402  (pick_cores, pinned, describe_cores, machine_info, loadavg)
import bench_ddp  # noqa: E402  (free_port)
import bench_gpt  # noqa: E402  (the model, its config and schedule, data, crew runs, measuring)

GOAL = 1.5  # crew ZeRO-3 / FSDP2
WORLD = 2
CREW_FLAGS = ["--devices", "cpu:2", "--batch-per-device", str(bench_gpt.GLOBAL_BATCH // WORLD)]
# key, contestant, layout, and crew train's flags, or the PyTorch wrapper ("fsdp2" or "ddp")
CONTESTANTS = [
    ("crew_zero3", "crew ZeRO-3", "2 replicas x 1 thread, --shard parameters", CREW_FLAGS + ["--shard", "parameters"]),
    ("torch_fsdp2", "torch FSDP2", "2 processes x 1 thread, gloo", "fsdp2"),
    ("crew_dp2", "crew", "2 replicas x 1 thread, unsharded", CREW_FLAGS),
    ("torch_ddp", "torch DDP", "2 processes x 1 thread, gloo", "ddp"),
]
log = bench_compare.log


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--crew", default=os.path.join(bench_gpt.ROOT, "build", "crew"), help="the crew binary [build/crew]")
    p.add_argument("--text", default=os.path.join(bench_gpt.ROOT, "data", "kjv.txt"),
                   help="training text [data/kjv.txt]")
    p.add_argument("--steps", type=int, default=30, help="timed steps per contestant [30]")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first [5]")
    p.add_argument("--rounds", type=int, default=1, help="runs of every contestant, in turns; the median counts [1]")
    p.add_argument("--idle", type=float, default=0.25,
                   help="before each contestant, wait while other processes keep more cores than this busy [0.25]")
    p.add_argument("--idle-wait", type=float, default=300, help="the longest such wait, in seconds [300]")
    p.add_argument("--markdown", action="store_true", help="print the results as a Markdown table")
    p.add_argument("--json", action="store_true", help="end with one JSON line of all figures")
    # Internal: a PyTorch contestant's launcher, and one of its ranks (see torch_launch, torch_rank).
    p.add_argument("--torch-launch", nargs=2, metavar=("WRAP", "SHARD"), help=argparse.SUPPRESS)
    p.add_argument("--torch-rank", nargs=4, metavar=("WRAP", "RANK", "PORT", "SHARD"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.steps < 1 or a.warmup < 1 or a.rounds < 1:
        p.error("--steps, --warmup and --rounds must be at least 1")
    return a


# ------------------------------------------------------------------ PyTorch: one rank, in a process of its own

def wrapped(torch, wrap, model):
    """model under FSDP2 (each block, then the root) or DDP; the name of the API used."""
    if wrap == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model), "DistributedDataParallel"
    try:
        from torch.distributed.fsdp import fully_shard
        api = "torch.distributed.fsdp.fully_shard"
    except ImportError:  # torch 2.4-2.5
        from torch.distributed._composable.fsdp import fully_shard
        api = "torch.distributed._composable.fsdp.fully_shard"
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model, api


def torch_rank(a):
    """Trains one rank of a WORLD-process gpt_tiny for --warmup + --steps steps; prints one JSON line."""
    import numpy as np
    import torch
    import torch.distributed as dist
    wrap, rank, port, shard = a.torch_rank[0], int(a.torch_rank[1]), a.torch_rank[2], a.torch_rank[3]
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=300))
    cfg = bench_gpt.model_config()
    total, T, per = a.warmup + a.steps, cfg["context"], bench_gpt.GLOBAL_BATCH // WORLD
    # bench_gpt's global batches (the same generator and seed), this rank's share of each.
    tokens = np.fromfile(shard, dtype=np.uint16, offset=1024).astype(np.int64)
    starts = np.random.default_rng(1).choice((len(tokens) - 1) // T, size=(total, bench_gpt.GLOBAL_BATCH)) * T
    own = starts[:, rank * per:(rank + 1) * per, None] + np.arange(T + 1)
    batches = [(torch.from_numpy(tokens[r][:, :-1].copy()), torch.from_numpy(tokens[r][:, 1:].copy())) for r in own]

    torch.manual_seed(1)  # the same weights on every rank
    net, api = wrapped(torch, wrap, bench_gpt.torch_gpt(torch, cfg))
    settings = dict(lr=cfg["lr"], betas=cfg["betas"], eps=cfg["eps"], weight_decay=cfg["weight_decay"])
    try:
        opt, optimizer = torch.optim.AdamW(net.parameters(), fused=True, **settings), "fused AdamW"
    except (RuntimeError, TypeError):
        opt, optimizer = torch.optim.AdamW(net.parameters(), foreach=True, **settings), "foreach AdamW"

    def train_step(x, y):
        loss = net(x, y)
        loss.backward()
        if cfg["clip_norm"] > 0:
            torch.nn.utils.clip_grad_norm_(net.parameters(), cfg["clip_norm"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    times, losses = [], []
    for step, (x, y) in enumerate(batches, 1):
        for group in opt.param_groups:
            group["lr"] = bench_gpt.learning_rate(cfg, step, total)
        dist.barrier()
        t0 = time.perf_counter()
        loss = train_step(x, y)
        times.append(time.perf_counter() - t0)
        losses.append(float(loss.detach()))
    dist.barrier()
    dist.destroy_process_group()
    print(json.dumps({"rank": rank, "times": times, "losses": losses, "api": api, "optimizer": optimizer,
                      "torch_version": torch.__version__, "threads": torch.get_num_threads()}))


def torch_launch(a):
    """Starts the WORLD rank processes of one PyTorch contestant (they inherit this process's
    cores), waits for them (ending the others when one fails, so none waits for ever in a
    collective), and prints one JSON line of the merged figures; exits 1 with the error when a rank
    failed."""
    wrap, shard = a.torch_launch
    port = str(bench_ddp.free_port())
    with tempfile.TemporaryDirectory(prefix="crew-bench-fsdp-") as tmp:
        procs = []
        for rank in range(WORLD):
            out, err = (open(os.path.join(tmp, f"{rank}.{s}"), "w+") for s in ("out", "err"))
            cmd = [sys.executable, os.path.abspath(__file__), "--steps", str(a.steps), "--warmup", str(a.warmup),
                   "--torch-rank", wrap, str(rank), port, shard]
            procs.append((subprocess.Popen(cmd, cwd=bench_gpt.ROOT, stdout=out, stderr=err), out, err))
        while any(p.poll() is None for p, _, _ in procs):
            if any(p.returncode for p, _, _ in procs):
                for p, _, _ in procs:
                    if p.poll() is None:
                        p.kill()
            time.sleep(0.05)
        results, errors = [], []
        for p, out, err in procs:
            out.seek(0)
            err.seek(0)
            lines = [ln for ln in out.read().splitlines() if ln.startswith("{")]
            if p.returncode == 0 and lines:
                results.append(json.loads(lines[-1]))
            else:
                why = [ln for ln in err.read().splitlines() if ln.strip()][-1:] or [f"exit status {p.returncode}"]
                errors.append((p.returncode, why[0]))
            out.close()
            err.close()
    if errors:  # the first rank to fail on its own, not one this launcher killed
        errors.sort(key=lambda e: e[0] == -9)
        sys.stderr.write(errors[0][1][:300] + "\n")
        raise SystemExit(1)
    slowest = [max(per_rank) for per_rank in zip(*(r["times"] for r in results))][a.warmup:]
    first = results[0]
    print(json.dumps({"step_s": statistics.median(slowest), "step_s_min": min(slowest), "step_s_max": max(slowest),
                      "rank0_step_s": statistics.median(first["times"][a.warmup:]),
                      "loss_first": statistics.fmean(r["losses"][0] for r in results),
                      "loss_last": statistics.fmean(r["losses"][-1] for r in results),
                      "api": first["api"], "optimizer": first["optimizer"],
                      "torch_version": first["torch_version"], "threads_per_rank": first["threads"]}))


# ------------------------------------------------------------------ the parent: runs and measures

def torch_contestant(a, shard, wrap):
    cmd = bench_compare.pinned(a.cores) + [
        sys.executable, os.path.abspath(__file__), "--steps", str(a.steps), "--warmup", str(a.warmup),
        "--torch-launch", wrap, shard]
    proc, wall, others = bench_gpt.measured(cmd)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        why = [ln for ln in proc.stderr.splitlines() if ln.strip()][-1:] or [f"exit status {proc.returncode}"]
        return {"failed": why[0][:300], "other_cores": others}
    return dict(json.loads(lines[-1]), process_wall_s=round(wall, 2), other_cores=others)


def one_run(a, data, shard, tmp, key, how, round_no):
    """One run of one contestant, once the machine is quiet (or --idle-wait has passed)."""
    idle = bench_gpt.wait_for_idle(a)
    r = (bench_gpt.crew_contestant(a, data, tmp, key, how, round_no) if isinstance(how, list)
         else torch_contestant(a, shard, how))
    return dict(r, other_cores_before=None if idle is None else round(idle, 3), round=round_no)


def summarise(a, runs):
    """One row per contestant (the median over its rounds that count), and the baseline row:
    FSDP2's, or DDP's where FSDP2 failed."""
    rows = {}
    for key, who, layout, _ in CONTESTANTS:
        done = [r for r in runs.get(key, []) if "step_s" in r]
        row = {"key": key, "contestant": who, "layout": layout}
        if not done:
            row.update(failed=runs[key][0]["failed"], other_cores=runs[key][0].get("other_cores"))
        else:
            quiet = [r for r in done if (r.get("other_cores") or 0) <= bench_gpt.NOISY]
            use = quiet or sorted(done, key=lambda r: r.get("other_cores") or 0)[:1]
            step_s = statistics.median(r["step_s"] for r in use)
            row.update(step_s=step_s, tokens_per_s=bench_gpt.GLOBAL_BATCH * a.context / step_s, runs=done,
                       rounds_used=[r["round"] for r in use],
                       other_cores=max((r["other_cores"] for r in use if r.get("other_cores") is not None),
                                       default=None))
        rows[key] = row
    base = rows["torch_fsdp2"] if "tokens_per_s" in rows["torch_fsdp2"] else rows["torch_ddp"]
    for row in rows.values():
        if "tokens_per_s" in row and "tokens_per_s" in base:
            row["vs_base"] = row["tokens_per_s"] / base["tokens_per_s"]
    return list(rows.values()), base


def rendered(head, table, markdown):
    """The table's lines, in Markdown (and a blank line) or aligned: the first two columns to the left."""
    if markdown:
        rule = ["---"] * 2 + ["--:"] * (len(head) - 2)
        return ["| " + " | ".join(t) + " |" for t in [head, rule] + table] + [""]
    widths = [max(map(len, column)) for column in zip(head, *table)]
    return ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(t, widths)))
            for t in [head] + table]


def print_report(a, info, rows, base, markdown):
    by = {r["key"]: r for r in rows}
    fsdp_error = by["torch_fsdp2"].get("failed")
    base_name = "FSDP2" if base["key"] == "torch_fsdp2" else "DDP"
    head = ["contestant", "layout", "ms/step", "tokens/s", f"/ {base_name}", "other procs"]
    table = []
    for r in rows:
        other = "?" if r.get("other_cores") is None else f"{r['other_cores']:.2f}"
        if "failed" in r:
            table.append([r["contestant"], r["layout"], "failed", "", "", other])
        else:
            table.append([r["contestant"], r["layout"], f"{1000 * r['step_s']:.1f}", f"{r['tokens_per_s']:,.0f}",
                          f"{r['vs_base']:.2f}x" if "vs_base" in r else "", other])
    how = (f"gpt_tiny training, global batch {bench_gpt.GLOBAL_BATCH} x {a.context} tokens, median step time of "
           f"{a.steps} steps after {a.warmup} warm-up steps"
           + (f", median of {a.rounds} rounds (those with other procs <= {bench_gpt.NOISY})" if a.rounds > 1 else ""))
    machine = (f"machine: {info['cpu']}, {info['cores']} CPUs (runs on {info['cores_used']}); {info['date']}; "
               f"crew {info['crew']} at {info['commit']}, GEMM {info['gemm']}; torch {info['torch']} "
               f"({info['fsdp_api']}, {info['optimizer']})")
    if markdown:
        print(f"{how}.  \n{machine[0].upper() + machine[1:]}.  \nCommand: `{info['command']}`\n")
    else:
        print(f"{how}\n{machine}\ncommand: {info['command']}")
    print("\n".join(rendered(head, table, markdown)))
    for r in rows:
        if "failed" in r and r["key"] != "torch_fsdp2":
            print(f"{r['contestant']} ({r['layout']}) failed: {r['failed']}")
    if fsdp_error:
        print(f"FSDP2 does not run on CPU here: {fsdp_error}; measured against DDP instead")
    noisy = [r for r in rows if (r.get("other_cores") or 0) > bench_gpt.NOISY]
    if noisy:
        print("warning: other processes used CPU during " + ", ".join(r["contestant"] for r in noisy)
              + ": those figures may be low, and the ratio is not a verdict")
    crew = by["crew_zero3"]
    ratio = f"{crew['vs_base']:.2f}x" if "vs_base" in crew else "n/a"
    print(f"crew ZeRO-3 / {base_name}: {ratio} (target {GOAL}x)")


def main():
    a = parse_args()
    if a.torch_rank:
        return torch_rank(a)
    if a.torch_launch:
        return torch_launch(a)
    a.context = bench_gpt.model_config()["context"]
    a.cores = bench_compare.pick_cores(2)
    if a.cores is None:
        raise SystemExit("bench_fsdp: this process may use only one core; the layouts need two")
    if not os.access(a.crew, os.X_OK):
        raise SystemExit(f"bench_fsdp: no {a.crew} (make build, or give --crew)")
    info = dict(bench_compare.machine_info(a.crew), cores_used=bench_compare.describe_cores(a.cores),
                command=" ".join(["python3", "tools/bench_fsdp.py"] + sys.argv[1:]),
                commit=bench_compare.capture(["git", "describe", "--always", "--dirty"]),
                load_before=bench_compare.loadavg())
    runs = {}
    with tempfile.TemporaryDirectory(prefix="crew-bench-fsdp-") as tmp:
        text, data = bench_gpt.ensure_text(a, tmp), os.path.join(tmp, "data")
        bench_compare.run([a.crew, "prep", "text", text, "--seq-len", str(a.context), "--test-fraction", "0.01",
                           "--out", data], stdout=subprocess.DEVNULL)
        shard = os.path.join(data, "train_000000.bin")
        for round_no in range(a.rounds):
            for key, who, layout, how in CONTESTANTS:
                if round_no and key == "torch_fsdp2" and "step_s" not in runs[key][0]:
                    continue  # it failed in round 1: DDP stands in, no use trying again
                r = one_run(a, data, shard, tmp, key, how, round_no)
                runs.setdefault(key, []).append(r)
                figure = (f"{bench_gpt.GLOBAL_BATCH * a.context / r['step_s']:,.0f} tokens/s" if "step_s" in r
                          else f"failed: {r['failed']}")
                log(f"  -> {who}, {layout}: {figure}; other processes used {r.get('other_cores', '?')} cores")
    info["load_after"] = bench_compare.loadavg()
    done = [r for key in ("torch_fsdp2", "torch_ddp") for r in runs.get(key, []) if "torch_version" in r]
    info["torch"] = done[0]["torch_version"] if done else "?"
    info["optimizer"] = done[0]["optimizer"] if done else "?"
    info["fsdp_api"] = next((r["api"] for r in runs.get("torch_fsdp2", []) if "api" in r), "FSDP2 failed")
    rows, base = summarise(a, runs)
    print_report(a, info, rows, base, a.markdown)
    if a.json:
        print(json.dumps({"machine": info, "steps": a.steps, "warmup": a.warmup, "rounds": a.rounds,
                          "global_batch": bench_gpt.GLOBAL_BATCH, "context": a.context, "baseline": base["key"],
                          "fsdp2_error": next((r["failed"] for r in rows if r["key"] == "torch_fsdp2"
                                               and "failed" in r), None),
                          "crew_zero3_vs_baseline": next((r.get("vs_base") for r in rows if r["key"] == "crew_zero3"),
                                                         None),
                          "target": GOAL, "rows": rows}))


if __name__ == "__main__":
    main()
