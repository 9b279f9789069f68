#!/usr/bin/env python3
"""Training throughput of a crew model file in PyTorch, for comparison with bench/bench_train.c.

    python3 tools/bench_torch.py MODEL.json DATA_DIR --batch B --steps S [--threads T]
                                 [--init-weights FILE] [--repeats R] [--json]

The network is built from crew's model file (the layers the Fashion-MNIST examples use: flatten,
dense, conv2d, max/avg pooling, dropout), in PyTorch's natural NCHW layout. With --init-weights it
starts from the safetensors file crew wrote (bench_train --save-init), converting layouts as
docs/WEIGHTS.md describes. The optimizer is AdamW with the model file's lr, betas, eps and weight
decay. The whole train split is normalised once up front ((x * scale - mean) / std, from the
manifest) into one float tensor, so PyTorch pays nothing per step for data while crew gathers and
normalises uint8 samples every step; each step takes the next B rows in order.

A 10-step warm-up comes first; then every timed run starts from the same weights with a fresh
optimizer and runs S steps. The median of R runs is reported, with min and max.
"""
import argparse
import json
import os
import statistics
import struct
import sys
import time

WARMUP_STEPS = 10


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="crew model file (JSON)")
    p.add_argument("data", help="dataset directory written by `crew prep`")
    p.add_argument("--batch", type=int, required=True, help="samples per step")
    p.add_argument("--steps", type=int, required=True, help="optimizer steps per timed run")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads [1]")
    p.add_argument("--init-weights", help="crew safetensors file to start from [torch's default init]")
    p.add_argument("--repeats", type=int, default=3, help="timed runs; the median is reported [3]")
    p.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    a = p.parse_args()
    for name in ("batch", "steps", "threads", "repeats"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be a positive integer")
    return a


ARGS = parse_args()

# Thread counts must be fixed before torch runs any parallel work.
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

torch.set_num_threads(ARGS.threads)
torch.set_num_interop_threads(1)


def pair(v, default):
    if v is None:
        return (default, default)
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


class Builder:
    """Turns crew's layer list into torch modules, tracking the NHWC shape for the conversions."""

    def __init__(self, input_shape):
        self.shape = list(input_shape)  # (H, W, C) or (F,), crew's layout
        self.modules = []
        self.loaders = []  # (torch module, crew layer name, kind, extra) for weight loading
        self.counts = {}
        self.flattened_from = None  # (H, W, C) when the previous layer was a Flatten of an image

    def name(self, spec, base):
        if spec.get("name"):
            return spec["name"]
        n = self.counts.get(base, 0)
        self.counts[base] = n + 1
        return base if n == 0 else f"{base}_{n}"

    def activation(self, act):
        table = {None: None, "linear": None, "relu": torch.nn.ReLU, "tanh": torch.nn.Tanh,
                 "sigmoid": torch.nn.Sigmoid, "gelu": torch.nn.GELU}
        if act == "softmax":
            return  # fused into the cross-entropy loss, as crew does
        if act not in table:
            raise SystemExit(f"bench_torch: activation '{act}' is not supported here")
        if table[act]:
            self.modules.append(table[act]())

    def add(self, spec):
        kind = spec["type"]
        getattr(self, "add_" + kind, self.unsupported)(spec)

    def unsupported(self, spec):
        raise SystemExit(f"bench_torch: layer type '{spec['type']}' is not supported here")

    def add_flatten(self, spec):
        self.name(spec, "flatten")
        # The input is fed NCHW, so a Flatten of an image yields (C, H, W) order, not crew's (H, W, C).
        self.flattened_from = tuple(self.shape) if len(self.shape) == 3 else None
        n = 1
        for d in self.shape:
            n *= d
        self.shape = [n]
        self.modules.append(torch.nn.Flatten())

    def add_dense(self, spec):
        name = self.name(spec, "dense")
        lin = torch.nn.Linear(self.shape[-1], int(spec["units"]), bias=not spec.get("use_bias") is False)
        self.modules.append(lin)
        self.loaders.append((lin, name, "dense", self.flattened_from))
        self.flattened_from = None
        self.shape = [int(spec["units"])]
        self.activation(spec.get("activation"))

    def add_conv2d(self, spec):
        name = self.name(spec, "conv2d")
        h, w, c = self.shape
        kh, kw = pair(spec.get("kernel_size"), 3)
        sh, sw = pair(spec.get("strides"), 1)
        same = spec.get("padding", "valid") == "same"
        if same and (sh, sw) != (1, 1):
            raise SystemExit("bench_torch: strided 'same' convolutions are not supported here")
        conv = torch.nn.Conv2d(c, int(spec["filters"]), (kh, kw), stride=(sh, sw),
                               padding="same" if same else 0, bias=not spec.get("use_bias") is False)
        self.modules.append(conv)
        self.loaders.append((conv, name, "conv2d", None))
        oh, ow = (h, w) if same else ((h - kh) // sh + 1, (w - kw) // sw + 1)
        self.shape = [oh, ow, int(spec["filters"])]
        self.activation(spec.get("activation"))

    def add_pool(self, spec, cls, base):
        self.name(spec, base)
        ph, pw = pair(spec.get("pool_size"), 2)
        sh, sw = pair(spec["strides"], 1) if spec.get("strides") else (ph, pw)  # Keras: the pool size
        if spec.get("padding", "valid") != "valid":
            raise SystemExit("bench_torch: 'same' pooling is not supported here")
        self.modules.append(cls((ph, pw), stride=(sh, sw)))
        h, w, c = self.shape
        self.shape = [(h - ph) // sh + 1, (w - pw) // sw + 1, c]

    def add_max_pool2d(self, spec):
        self.add_pool(spec, torch.nn.MaxPool2d, "max_pooling2d")

    def add_avg_pool2d(self, spec):
        self.add_pool(spec, torch.nn.AvgPool2d, "average_pooling2d")

    def add_dropout(self, spec):
        self.name(spec, "dropout")
        self.modules.append(torch.nn.Dropout(float(spec.get("rate", 0.0))))

    def add_activation(self, spec):
        self.name(spec, "activation")
        self.activation(spec.get("activation"))


def read_safetensors(path):
    """crew's weights file with NumPy alone (docs/WEIGHTS.md): {name: float32 array}."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    data = raw[8 + n:]
    out = {}
    for k, v in header.items():
        if v["dtype"] != "F32":
            raise SystemExit(f"{path}: tensor '{k}' is {v['dtype']}, expected F32")
        b, e = v["data_offsets"]
        out[k] = np.frombuffer(data[b:e], "<f4").reshape(v["shape"]).copy()
    return out


def load_weights(builder, path):
    w = read_safetensors(path)
    want = [n + ".kernel" for _, n, _, _ in builder.loaders]
    want += [n + ".bias" for m, n, _, _ in builder.loaders if m.bias is not None]
    missing = [n for n in want if n not in w]
    if missing:
        raise SystemExit(f"{path}: tensors {missing} are missing (is it the weights of this model?)")
    used = set()
    with torch.no_grad():
        for mod, name, kind, flat in builder.loaders:
            k = torch.from_numpy(w[name + ".kernel"])
            used.add(name + ".kernel")
            want_shape = tuple(mod.weight.shape[::-1]) if kind == "dense" else \
                tuple(mod.weight.permute(2, 3, 1, 0).shape)
            if tuple(k.shape) != want_shape:
                raise SystemExit(f"{path}: tensor '{name}.kernel' has shape {list(k.shape)} but the model "
                                 f"needs {list(want_shape)}")
            if kind == "conv2d":
                mod.weight.copy_(k.permute(3, 2, 0, 1))  # [kh,kw,cin,cout] -> [cout,cin,kh,kw]
            else:
                if flat:  # rows in (H, W, C) order; torch's Flatten of NCHW gives (C, H, W)
                    h, wd, c = flat
                    k = k.reshape(h, wd, c, -1).permute(2, 0, 1, 3).reshape(h * wd * c, -1)
                mod.weight.copy_(k.T)
            if mod.bias is not None:
                mod.bias.copy_(torch.from_numpy(w[name + ".bias"]))
                used.add(name + ".bias")
    extra = set(w) - used
    if extra:
        raise SystemExit(f"{path}: tensors {sorted(extra)} have no place in the PyTorch model")


def load_data(data_dir, image):
    """The train split, normalised once: x float32 [N, C, H, W] (images) or [N, ...]; y int64 [N]."""
    man = json.load(open(os.path.join(data_dir, "manifest.json")))
    split = man["splits"]["train"]
    x = np.load(os.path.join(data_dir, split["x"]["file"]))
    y = np.load(os.path.join(data_dir, split["y"]["file"])).astype(np.int64)
    norm = man["normalization"]
    mean = np.asarray(norm["mean"], np.float32)
    std = np.asarray(norm["std"], np.float32)
    x = (x.astype(np.float32) * np.float32(norm["scale"]) - mean) / std  # broadcasts over channels
    t = torch.from_numpy(x)
    if image:
        t = t.permute(0, 3, 1, 2).contiguous()
    return t, torch.from_numpy(y)


def optimizer_of(model_file, params):
    o = model_file.get("optimizer", {})
    if o.get("type", "adamw") != "adamw":
        raise SystemExit("bench_torch: only the adamw optimizer is supported here")
    return torch.optim.AdamW(params, lr=float(o.get("lr", 1e-3)),
                             betas=(float(o.get("beta1", 0.9)), float(o.get("beta2", 0.999))),
                             eps=float(o.get("eps", 1e-8)), weight_decay=float(o.get("weight_decay", 0.0)))


def build(model_file):
    b = Builder(model_file["input_shape"])
    for spec in model_file["layers"]:
        b.add(spec)
    return b


def timed_run(model_file, x, y, init_state, steps, batch):
    b = build(model_file)
    net = torch.nn.Sequential(*b.modules)
    net.load_state_dict(init_state)
    net.train()
    opt = optimizer_of(model_file, net.parameters())
    n = x.shape[0] - x.shape[0] % batch
    start = 0
    t0 = time.perf_counter()
    for _ in range(steps):
        xb, yb = x[start:start + batch], y[start:start + batch]
        start = (start + batch) % n
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(xb), yb)
        loss.backward()
        opt.step()
    elapsed = time.perf_counter() - t0
    return steps * batch / elapsed, float(loss.detach())


def thread_summary():
    lines = torch.__config__.parallel_info().splitlines()
    keep = [ln.strip() for ln in lines if "get_num_threads" in ln or "get_num_interop_threads" in ln
            or "parallel backend" in ln]
    return "; ".join(keep)


def main():
    a = ARGS
    model_file = json.load(open(a.model))
    probe = build(model_file)
    image = len(model_file["input_shape"]) == 3
    net = torch.nn.Sequential(*probe.modules)
    if a.init_weights:
        load_weights(probe, a.init_weights)
    init_state = {k: v.clone() for k, v in net.state_dict().items()}
    x, y = load_data(a.data, image)
    if x.shape[0] < a.batch:
        raise SystemExit(f"{a.data}: {x.shape[0]} training samples, fewer than one batch of {a.batch}")
    print(f"bench_torch: torch {torch.__version__}; {thread_summary()}", file=sys.stderr)
    timed_run(model_file, x, y, init_state, WARMUP_STEPS, a.batch)
    runs = []
    for i in range(a.repeats):
        sps, loss = timed_run(model_file, x, y, init_state, a.steps, a.batch)
        runs.append(sps)
        if not a.json:
            print(f"  run {i + 1}: {sps:.1f} samples/s (last loss {loss:.4f})", file=sys.stderr)
    med = statistics.median(runs)
    label = os.path.splitext(os.path.basename(a.model))[0]
    ms = 1000.0 * a.batch / med
    spread = 100.0 * (max(runs) - min(runs)) / med
    print(f"{label}: torch, {a.threads} thread(s), batch {a.batch}, {a.steps} steps, median of {a.repeats}")
    print(f"  {med:.1f} samples/s  {ms:.3f} ms/step  (min {min(runs):.1f}, max {max(runs):.1f}, "
          f"spread {spread:.1f}%)")
    if a.json:
        print(json.dumps({"framework": "torch", "torch_version": torch.__version__, "model": label,
                          "devices": 1, "threads_per_device": a.threads, "batch": a.batch, "steps": a.steps,
                          "repeats": a.repeats, "samples_per_s": round(med, 3), "ms_per_step": round(ms, 4),
                          "samples_per_s_min": round(min(runs), 3), "samples_per_s_max": round(max(runs), 3),
                          "runs": [round(r, 3) for r in runs], "init_weights": a.init_weights}))


if __name__ == "__main__":
    main()
