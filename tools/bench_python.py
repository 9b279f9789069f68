#!/usr/bin/env python3
"""The Python package's benchmarks (issue 31), each side measured in the same run on the same cores.

    python3 tools/bench_python.py [--markdown] [--rounds 3] [--steps 300] [--target 0.90]
                                  [--max-epochs 8] [--torch-python PY] [--cores N]

A. crew.fit against crew train: the demo CNN (examples/fashion_cnn.json) on the prepared
   Fashion-MNIST directory, --steps optimizer steps on every given core, rounds alternating the
   two (crew train first); each side's samples/s is the run's own (crew_fit_result.samples_per_s:
   training steps only), and the figure is the median over the rounds of crew.fit / crew train.
   Target: >= 0.98.

B. The demo CNN to the target test accuracy from Python: the same Keras model (the demo's layers,
   AdamW 1e-3 with weight decay 1e-4, constant rate, global batch 128, shuffled each epoch,
   evaluated on the test split after every epoch) trained three ways, each in a process of its
   own pinned to the same cores with taskset:
     - crew.fit(model, x, y, batch_size=128) on the cores (one replica each);
     - Keras's own model.fit on its JAX backend (XLA's CPU threads on the same cores);
     - PyTorch: the same layers and optimizer, a DataLoader of the same batch, the usual loop,
       torch.set_num_threads(cores) (--torch-python names a Python with torch; skipped without).
   Each worker reports, per epoch, the seconds since its process started and the test accuracy;
   the figure is the seconds to the first epoch at or above the target, start-up, imports, JIT
   compilation and evaluation included, and the ratios other / crew.fit.

Needs this Python to have crew (pip install .), Keras 3 and JAX; progress goes to stderr.
"""
import argparse
import datetime
import gzip
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FASHION = "/usr/share/datasets/fashion-mnist"
T0 = time.monotonic()


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def fashion_arrays():
    def idx(name):
        with gzip.open(os.path.join(FASHION, name)) as f:
            data = f.read()
        import numpy as np

        dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(data[3])]
        return np.frombuffer(data, np.uint8, offset=4 + 4 * data[3]).reshape(dims)

    x = idx("train-images-idx3-ubyte.gz")[..., None].astype("float32") / 255.0
    xt = idx("t10k-images-idx3-ubyte.gz")[..., None].astype("float32") / 255.0
    return x, idx("train-labels-idx1-ubyte.gz"), xt, idx("t10k-labels-idx1-ubyte.gz")


# ------------------------------------------------------------------------------------------ workers

def emit(record):
    record["s"] = time.monotonic() - T0
    print(json.dumps(record), flush=True)


def keras_model(keras):
    keras.utils.set_random_seed(1)
    m = keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"), keras.layers.MaxPooling2D(2),
        keras.layers.Conv2D(64, 3, padding="same", activation="relu"), keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(), keras.layers.Dense(128, activation="relu"), keras.layers.Dropout(0.3),
        keras.layers.Dense(10, activation="softmax")], name="fashion_cnn")
    m.compile(optimizer=keras.optimizers.AdamW(1e-3, weight_decay=1e-4), loss="sparse_categorical_crossentropy",
              metrics=["accuracy"])
    return m


def worker_keras_side(a, use_crew):
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import keras

    emit({"type": "imported", "keras": keras.__version__, "backend": keras.backend.backend()})
    x, y, xt, yt = fashion_arrays()
    model = keras_model(keras)
    emit({"type": "loaded"})

    class Report(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            emit({"type": "epoch", "epoch": epoch + 1, "test_accuracy": float(logs["val_accuracy"])})
            if logs["val_accuracy"] >= a.target:
                self.model.stop_training = True

    if use_crew:
        import crew

        run = tempfile.mkdtemp(prefix="bench-python-")
        h = crew.fit(model, x, y, epochs=a.max_epochs, batch_size=128, devices=f"cpu:{a.cores}",
                     validation_data=(xt, yt), run_dir=run, verbose=0, callbacks=[Report()])
        emit({"type": "done", "samples_per_s": h.crew["result"]["samples_per_s"]})
        shutil.rmtree(run, ignore_errors=True)
    else:
        t = time.monotonic()
        h = model.fit(x, y, epochs=a.max_epochs, batch_size=128, validation_data=(xt, yt), verbose=0,
                      callbacks=[Report()], shuffle=True)
        epochs = len(h.history["loss"])
        emit({"type": "done", "samples_per_s": epochs * (len(x) // 128) * 128 / (time.monotonic() - t)})


def worker_torch(a):
    import numpy as np
    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.set_num_threads(a.cores)
    torch.set_num_interop_threads(1)
    emit({"type": "imported", "torch": torch.__version__})
    x, y, xt, yt = fashion_arrays()
    to = lambda v: torch.from_numpy(np.ascontiguousarray(v.transpose(0, 3, 1, 2)))  # noqa: E731
    train = TensorDataset(to(x), torch.from_numpy(y.astype(np.int64)))
    test = TensorDataset(to(xt), torch.from_numpy(yt.astype(np.int64)))
    torch.manual_seed(1)
    net = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                        nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Dropout(0.3), nn.Linear(128, 10))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=1e-4)
    loader = DataLoader(train, batch_size=128, shuffle=True, drop_last=True, num_workers=0)
    emit({"type": "loaded"})
    seen, t = 0, time.monotonic()
    for epoch in range(a.max_epochs):
        net.train()
        for xb, yb in loader:
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(net(xb), yb).backward()
            opt.step()
            seen += len(xb)
        net.eval()
        correct = 0
        with torch.no_grad():
            for xb, yb in DataLoader(test, batch_size=1000):
                correct += int((net(xb).argmax(1) == yb).sum())
        acc = correct / len(test)
        emit({"type": "epoch", "epoch": epoch + 1, "test_accuracy": acc})
        if acc >= a.target:
            break
    emit({"type": "done", "samples_per_s": seen / (time.monotonic() - t)})


# ------------------------------------------------------------------------------------------ driver

def cores_of(n):
    have = sorted(os.sched_getaffinity(0))
    return have[:n] if n else have


def run_worker(python, side, a, cores):
    cmd = ["taskset", "-c", ",".join(map(str, cores)), python, os.path.abspath(__file__), "--worker", side,
           "--cores", str(len(cores)), "--target", str(a.target), "--max-epochs", str(a.max_epochs)]
    log("$ " + " ".join(cmd))
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"bench_python: {side} failed:\n{p.stderr[-2000:]}")
    records = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    epochs = [r for r in records if r["type"] == "epoch"]
    hit = next((r for r in epochs if r["test_accuracy"] >= a.target), None)
    done = next(r for r in records if r["type"] == "done")
    return {"side": side, "epochs": hit["epoch"] if hit else None, "s": hit["s"] if hit else None,
            "accuracy": [round(r["test_accuracy"], 4) for r in epochs], "samples_per_s": done["samples_per_s"],
            "wall_s": done["s"]}


def part_a(a, cores):
    import crew

    data = os.path.join(ROOT, "data", "fashion-mnist")
    cli = crew._cli.executable()
    if not os.path.exists(os.path.join(data, "manifest.json")):
        subprocess.run([cli, "prep", "fashion-mnist", "--out", data], check=True, capture_output=True)
    model = os.path.join(ROOT, "examples", "fashion_cnn.json")
    os.sched_setaffinity(0, cores)
    devices = f"cpu:{len(cores)}"
    ratios, rows = [], []
    for r in range(a.rounds):
        with tempfile.TemporaryDirectory(prefix="bench-python-") as tmp:
            cmd = [cli, "train", model, "--data", data, "--devices", devices, "--max-steps", str(a.steps),
                   "--run-dir", f"{tmp}/cli", "--quiet", "--json", "--layout", "replicas"]
            log("$ " + " ".join(cmd))
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            cli_sps = json.loads(out.strip().splitlines()[-1])["samples_per_s"]
            log(f"crew.fit({model!r}, {data!r}, devices={devices!r}, max_steps={a.steps})")
            h = crew.fit(model, data, devices=devices, max_steps=a.steps, run_dir=f"{tmp}/py", verbose=0)
            py_sps = h.crew["result"]["samples_per_s"]
        ratios.append(py_sps / cli_sps)
        rows.append((r + 1, cli_sps, py_sps, py_sps / cli_sps))
        log(f"round {r + 1}: crew train {cli_sps:.0f} samples/s, crew.fit {py_sps:.0f}: {py_sps / cli_sps:.3f}")
    return rows, statistics.median(ratios)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--worker", choices=["crew", "keras", "torch"])
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--target", type=float, default=0.90)
    p.add_argument("--max-epochs", type=int, default=8)
    p.add_argument("--cores", type=int, default=0)
    p.add_argument("--torch-python", default=None)
    p.add_argument("--skip", default="", help="comma-separated parts or sides left out: a, b, keras, torch")
    a = p.parse_args()
    if a.worker == "torch":
        return worker_torch(a)
    if a.worker:
        return worker_keras_side(a, a.worker == "crew")
    cores = cores_of(a.cores)
    skip = set(filter(None, a.skip.split(",")))
    print(f"machine: {platform.node()}, {platform.processor() or platform.machine()}, cores {cores}, "
          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, load {os.getloadavg()[0]:.2f}")
    if "a" not in skip:
        rows, median = part_a(a, cores)
        print(f"\nA. crew.fit / crew train, the demo CNN, {a.steps} steps on {len(cores)} cores, samples/s:\n")
        print("| round | crew train | crew.fit | ratio |\n|--:|--:|--:|--:|")
        for r in rows:
            print(f"| {r[0]} | {r[1]:.0f} | {r[2]:.0f} | {r[3]:.3f} |")
        print(f"\nmedian ratio {median:.3f} (target >= 0.98: {'met' if median >= 0.98 else 'not met'})")
    if "b" in skip:
        return
    results = [run_worker(sys.executable, "crew", a, cores)]
    if "keras" not in skip:
        results.append(run_worker(sys.executable, "keras", a, cores))
    if "torch" not in skip and a.torch_python:
        results.append(run_worker(a.torch_python, "torch", a, cores))
    print(f"\nB. the demo CNN in Keras to test accuracy {a.target} on {len(cores)} cores (seconds from the "
          "process's start, everything included):\n")
    print("| side | epochs | s to target | s / crew.fit's | test accuracy per epoch | training samples/s |")
    print("|---|--:|--:|--:|---|--:|")
    base = results[0]["s"]
    names = {"crew": "crew.fit", "keras": "Keras model.fit (JAX)", "torch": "PyTorch"}
    for r in results:
        ratio = f"{r['s'] / base:.2f}" if r["s"] and base else "-"
        s = f"{r['s']:.1f}" if r["s"] else f"not reached ({r['wall_s']:.0f} s)"
        print(f"| {names[r['side']]} | {r['epochs'] or '-'} | {s} | {ratio} | "
              f"{', '.join(map(str, r['accuracy']))} | {r['samples_per_s']:.0f} |")


if __name__ == "__main__":
    main()
