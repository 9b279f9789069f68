#!/usr/bin/env python3
"""Training throughput of a crew model file under PyTorch DDP (gloo), the peer of `mpirun crew train`.

    python3 tools/bench_ddp.py MODEL.json DATA_DIR --batch B --steps S [--procs P] [--threads T]
                               [--bind none|core] [--init-weights FILE] [--repeats R] [--json]

--procs 1 (the default) trains in this process alone, without a process group: the baseline of
the data-parallel efficiency. --procs P > 1 starts P processes (torch.multiprocessing, spawn) that
join a gloo process group on 127.0.0.1 and train the same network wrapped in
DistributedDataParallel (its defaults: 25 MB buckets, gradients averaged by all-reduce during
backward). B is the batch of each process, so a step trains P x B samples; each process takes its
own B rows of every global batch. Every process sets torch.set_num_threads(T) (1 by default, as a
crew replica has one BLAS thread) and torch.set_num_interop_threads(1). --bind core pins process p
to the p-th CPU this program may use (as `mpirun --bind-to core`); --bind none leaves placement to
the kernel.

The network, the data and the optimizer are tools/bench_torch.py's, imported rather than copied:
the model file's layers in NCHW, AdamW with the file's lr, betas, eps and weight decay (constant
rate), the train split normalised once up front into one float tensor (PyTorch pays nothing per
step for data while crew gathers and normalises uint8 samples every step), --init-weights to start
from crew's safetensors file. With more than one process, DDP copies rank 0's weights to the
others when it wraps the model.

Timing as in bench_torch.py: a 10-step warm-up, then R timed runs of S steps, each from the same
weights with a fresh optimizer (and a fresh DDP wrapper). A timed run starts after a barrier and
ends after a barrier, and its time is the slowest process's, so samples/s = S x P x B / time. The
median of R runs is reported, with min and max; --json ends with one JSON line of the figures.
"""
import argparse
import importlib.util
import json
import os
import socket
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="crew model file (JSON)")
    p.add_argument("data", help="dataset directory written by `crew prep`")
    p.add_argument("--batch", type=int, required=True, help="samples per process per step")
    p.add_argument("--steps", type=int, required=True, help="optimizer steps per timed run")
    p.add_argument("--procs", type=int, default=1, help="processes; 1 = no process group, no DDP [1]")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per process [1]")
    p.add_argument("--bind", choices=("none", "core"), default="none",
                   help="pin process p to the p-th usable CPU (core) or not (none) [none]")
    p.add_argument("--init-weights", help="crew safetensors file to start from [torch's default init, seed 1]")
    p.add_argument("--repeats", type=int, default=3, help="timed runs; the median is reported [3]")
    p.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    a = p.parse_args(argv)
    for name in ("batch", "steps", "procs", "threads", "repeats"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be a positive integer")
    return a


def import_bench_torch(a):
    """tools/bench_torch.py as a module. It parses its command line when imported, so it is given
    one that matches ours; it also sets torch's thread counts to --threads and 1 interop thread."""
    saved = sys.argv
    sys.argv = [os.path.join(HERE, "bench_torch.py"), a.model, a.data, "--batch", str(a.batch),
                "--steps", str(a.steps), "--threads", str(a.threads)]
    try:
        spec = importlib.util.spec_from_file_location("bench_torch", sys.argv[0])
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.argv = saved
    return mod


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, a, port, queue):
    """One process: rank of a.procs (a.procs == 1: alone, no process group). Rank 0 puts its
    figures on the queue (or returns them when alone)."""
    if a.bind == "core":
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
    import warnings
    # DDP's bucket views and autograd disagree on the stride of the first convolution's in-channel
    # dimension, which has size 1 (so either stride is right); DDP then copies that 288-float
    # gradient once per step and warns. It costs nothing measurable here.
    warnings.filterwarnings("ignore", message="Grad strides do not match bucket view strides")
    bt = import_bench_torch(a)
    torch = bt.torch
    F = bt.F
    torch.set_num_threads(a.threads)
    dist = None
    if a.procs > 1:
        import torch.distributed as dist
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=a.procs)

    model_file = json.load(open(a.model))
    image = len(model_file["input_shape"]) == 3
    torch.manual_seed(1)
    probe = bt.build(model_file)
    net0 = torch.nn.Sequential(*probe.modules)
    if a.init_weights:
        bt.load_weights(probe, a.init_weights)
    init_state = {k: v.clone() for k, v in net0.state_dict().items()}
    x, y = bt.load_data(a.data, image)
    gb = a.batch * a.procs
    if x.shape[0] < gb:
        raise SystemExit(f"{a.data}: {x.shape[0]} training samples, fewer than one global batch of {gb}")
    n = x.shape[0] - x.shape[0] % gb

    def timed_run(steps):
        b = bt.build(model_file)
        net = torch.nn.Sequential(*b.modules)
        net.load_state_dict(init_state)
        net.train()
        if dist:
            net = torch.nn.parallel.DistributedDataParallel(net)
        opt = bt.optimizer_of(model_file, net.parameters())
        start = 0
        if dist:
            dist.barrier()
        t0 = time.perf_counter()
        for _ in range(steps):
            lo = start + rank * a.batch
            xb, yb = x[lo:lo + a.batch], y[lo:lo + a.batch]
            start = (start + gb) % n
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(net(xb), yb)
            loss.backward()
            opt.step()
        if dist:
            dist.barrier()
        elapsed = time.perf_counter() - t0
        if dist:  # the slowest process's time
            t = torch.tensor([elapsed], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            elapsed = float(t[0])
        return steps * gb / elapsed, float(loss.detach())

    if rank == 0:
        print(f"bench_ddp: torch {torch.__version__}; {a.procs} process(es); {bt.thread_summary()}",
              file=sys.stderr)
    timed_run(bt.WARMUP_STEPS)
    runs = []
    for i in range(a.repeats):
        sps, loss = timed_run(a.steps)
        runs.append(sps)
        if rank == 0 and not a.json:
            print(f"  run {i + 1}: {sps:.1f} samples/s (last loss on rank 0 {loss:.4f})", file=sys.stderr)
    out = {"runs": runs, "torch_version": torch.__version__, "warmup": bt.WARMUP_STEPS}
    if dist:
        dist.barrier()
        dist.destroy_process_group()
    if rank == 0:
        if queue is None:
            return out
        queue.put(out)
    return None


def main():
    a = parse_args()
    if a.procs == 1:
        res = worker(0, a, 0, None)
    else:
        import torch.multiprocessing as mp
        ctx = mp.get_context("spawn")
        queue = ctx.SimpleQueue()
        mp.start_processes(worker, args=(a, free_port(), queue), nprocs=a.procs, join=True,
                           start_method="spawn")
        res = queue.get()
    runs = res["runs"]
    med = statistics.median(runs)
    label = os.path.splitext(os.path.basename(a.model))[0]
    gb = a.batch * a.procs
    ms = 1000.0 * gb / med
    spread = 100.0 * (max(runs) - min(runs)) / med
    mode = f"DDP gloo, {a.procs} processes" if a.procs > 1 else "1 process (no DDP)"
    print(f"{label}: torch {mode} x {a.threads} thread(s), batch {a.batch} per process "
          f"(global {gb}), {a.steps} steps, bind {a.bind}, median of {a.repeats}")
    print(f"  {med:.1f} samples/s  {ms:.3f} ms/step  (min {min(runs):.1f}, max {max(runs):.1f}, "
          f"spread {spread:.1f}%)")
    if a.json:
        print(json.dumps({"framework": "torch-ddp" if a.procs > 1 else "torch",
                          "torch_version": res["torch_version"], "backend": "gloo" if a.procs > 1 else None,
                          "model": label, "procs": a.procs, "threads_per_proc": a.threads, "bind": a.bind,
                          "batch_per_proc": a.batch, "global_batch": gb, "steps": a.steps,
                          "warmup_steps": res["warmup"], "repeats": a.repeats,
                          "samples_per_s": round(med, 3), "ms_per_step": round(ms, 4),
                          "samples_per_s_min": round(min(runs), 3), "samples_per_s_max": round(max(runs), 3),
                          "runs": [round(r, 3) for r in runs], "init_weights": a.init_weights}))


if __name__ == "__main__":
    main()
