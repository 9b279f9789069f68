#!/usr/bin/env python3
"""Writes the PyTorch reference fixtures that tests/test_reference.c compares crew against.

Run from anywhere:  python3 tools/make_reference.py
Needs torch, numpy and safetensors (pip install torch numpy safetensors). The C tests never need
them: they only read the files written here, tests/fixtures/reference/<name>.safetensors.

For each model file below the script builds the same network in PyTorch (float32, one thread,
deterministic algorithms), with parameters kept in crew's layouts (dense kernel [in, out], conv
kernel [kh, kw, cin, cout]) and activations kept NHWC, so the gradients autograd returns are
already in crew's layouts. It then records, for one batch of 8 samples:
  x [8, 28, 28, 1] F32, y [8] I32           the batch
  init/<param>                              the starting parameters (crew names and layouts)
  logits [8, classes], loss [1]             forward pass, mean softmax cross-entropy
  grad/<param>                              d loss / d param
  sgd_losses [10]                           the loss before each of 10 SGD steps on the batch
Dropout uses crew's own mask (src/core/rng.h, src/backend/cpu/cpu_activation.c), reimplemented
below bit for bit, so both sides drop the same values.
"""
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.numpy import load_file, save_file

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
OUT_DIR = os.path.join(ROOT, "tests", "fixtures", "reference")

# name -> model file (relative to the repository root). The C test holds the same table.
MODELS = [
    ("fashion_mlp", "examples/fashion_mlp.json"),
    ("fashion_cnn", "examples/fashion_cnn.json"),
    ("keras_fashion_mlp", "tests/fixtures/keras/fashion_mlp.json"),
]

BATCH = 8
SEED = 1            # crew_pass.seed: the dropout masks' seed
INIT_SEED = 20240601  # numpy seed for the batch and the initial parameters
LR = 0.05
MOMENTUM = 0.9
SGD_STEPS = 10

# ------------------------------------------------------------------ crew's RNG (src/core/rng.h)

MASK64 = (1 << 64) - 1
STREAM_DROPOUT = 3


def mix64(z):
    """SplitMix64's finaliser with 64-bit wraparound, as crew_mix64."""
    z = (z + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def rng_key(seed, a, b, c):
    return mix64(mix64(mix64(mix64(seed) ^ a) ^ b) ^ c)


def rng_uniform(key, counter):
    """crew_rng_uniform: 24 random bits as a float32 in [0, 1), exact."""
    return np.float32(mix64(key ^ mix64(counter)) >> 40) * np.float32(1.0 / 16777216.0)


def dropout_mask(rate, step, layer_index, sample_ids, cols):
    """cpu_dropout_forward's mask: [rows, cols] float32 of 0 or 1/(1 - rate), all in float32."""
    rate = np.float32(rate)
    keep_scale = np.float32(1.0) / (np.float32(1.0) - rate)
    key = rng_key(SEED, STREAM_DROPOUT, step, layer_index)
    mask = np.zeros((len(sample_ids), cols), dtype=np.float32)
    for r, sid in enumerate(sample_ids):
        row_key = rng_key(key, sid, 0, 0)
        for j in range(cols):
            if rng_uniform(row_key, j) >= rate:
                mask[r, j] = keep_scale
    return mask


def self_test_rng():
    # crew_mix64(0) as a C program including src/core/rng.h prints it: catches a broken port.
    assert mix64(0) == 0xE220A8397B1DCDAF, hex(mix64(0))


# ------------------------------------------------------------------ model files -> layer lists

ACTS = {"linear", "relu", "gelu", "tanh", "sigmoid", "softmax"}


def pair(v, default):
    if v is None:
        return default
    if isinstance(v, int):
        return (v, v)
    return (int(v[0]), int(v[1]))


def keras_layers(doc):
    """A Keras 3 Sequential to_json(): (input shape, [layer dict])."""
    cfg = doc["config"]
    shape = None
    out = []
    for entry in cfg["layers"]:
        kind, c = entry["class_name"], entry["config"]
        if kind == "InputLayer":
            shape = tuple(c["batch_shape"][1:])
            continue
        layer = {"name": c.get("name")}
        if kind == "Dense":
            layer.update(type="dense", units=c["units"], activation=c.get("activation") or "linear",
                         bias=c.get("use_bias", True))
        elif kind == "Conv2D":
            layer.update(type="conv2d", filters=c["filters"], kernel=pair(c["kernel_size"], None),
                         strides=pair(c.get("strides"), (1, 1)), padding=c.get("padding", "valid"),
                         activation=c.get("activation") or "linear", bias=c.get("use_bias", True))
        elif kind in ("MaxPooling2D", "AveragePooling2D"):
            pool = pair(c.get("pool_size"), (2, 2))
            layer.update(type="max_pool2d" if kind == "MaxPooling2D" else "avg_pool2d", pool=pool,
                         strides=pair(c.get("strides"), pool), padding=c.get("padding", "valid"))
        elif kind == "Flatten":
            layer.update(type="flatten")
        elif kind == "Dropout":
            layer.update(type="dropout", rate=c["rate"])
        elif kind == "Activation":
            layer.update(type="activation", activation=c["activation"])
        else:
            raise SystemExit(f"make_reference.py: Keras layer {kind} is not supported here")
        out.append(layer)
    if shape is None:
        shape = tuple(cfg["build_input_shape"][1:])
    return shape, out


# crew's layer "type"s (src/nn/model_file.c) that this script can rebuild in PyTorch.
CREW_TYPES = {"dense", "conv2d", "max_pool2d", "avg_pool2d", "flatten", "dropout", "activation"}


def crew_layers(doc):
    """crew's own model format: (input shape, [layer dict])."""
    out = []
    for c in doc["layers"]:
        kind = c["type"]
        if kind not in CREW_TYPES:
            raise SystemExit(f"make_reference.py: crew layer type {c['type']} is not supported here")
        layer = {"type": kind, "name": c.get("name")}
        if kind == "dense":
            layer.update(units=c["units"], activation=c.get("activation", "linear"), bias=c.get("use_bias", True))
        elif kind == "conv2d":
            layer.update(filters=c["filters"], kernel=pair(c["kernel_size"], None),
                         strides=pair(c.get("strides"), (1, 1)), padding=c.get("padding", "valid"),
                         activation=c.get("activation", "linear"), bias=c.get("use_bias", True))
        elif kind in ("max_pool2d", "avg_pool2d"):
            pool = pair(c.get("pool_size"), (2, 2))
            layer.update(pool=pool, strides=pair(c.get("strides"), pool), padding=c.get("padding", "valid"))
        elif kind == "dropout":
            layer.update(rate=c["rate"])
        elif kind == "activation":
            layer.update(activation=c["activation"])
        out.append(layer)
    return tuple(doc["input_shape"]), out


STEMS = {"dense": "dense", "conv2d": "conv2d", "max_pool2d": "max_pooling2d", "avg_pool2d": "average_pooling2d",
         "flatten": "flatten", "dropout": "dropout", "activation": "activation"}


def expand(layers):
    """crew_model_add's list: Keras-style automatic names, and dense/conv2d with an activation
    followed by an activation layer '<name>_act'. Dropout masks are keyed by these indices."""
    names, out = set(), []
    for layer in layers:
        layer = dict(layer)
        name = layer.get("name")
        if not name:
            stem, k = STEMS[layer["type"]], 1
            name = stem
            while name in names:
                name, k = f"{stem}_{k}", k + 1
        layer["name"] = name
        names.add(name)
        out.append(layer)
        act = layer.get("activation", "linear")
        if act not in ACTS:
            raise SystemExit(f"make_reference.py: activation {act} is not supported here")
        if layer["type"] in ("dense", "conv2d") and act != "linear":
            layer["activation"] = "linear"
            out.append({"type": "activation", "name": name + "_act", "activation": act})
            names.add(name + "_act")
    for i, layer in enumerate(out):
        layer["index"] = i
    # A trailing softmax is fused into the loss: the logits come from the layer before it.
    if out[-1]["type"] == "activation" and out[-1]["activation"] == "softmax":
        out = out[:-1]
    return out


def load_model(path):
    with open(os.path.join(ROOT, path)) as f:
        doc = json.load(f)
    shape, layers = keras_layers(doc) if doc.get("class_name") == "Sequential" else crew_layers(doc)
    return tuple(int(d) for d in shape), expand(layers)


# ------------------------------------------------------------------ parameters and forward pass

def same_pads(size, k, s):
    """TensorFlow's 'same': ceil(size / s) outputs, the odd cell of padding after."""
    out = (size + s - 1) // s
    total = max((out - 1) * s + k - size, 0)
    return total // 2, total - total // 2


def init_params(shape, layers, rng):
    """Glorot-uniform kernels and small uniform biases, in crew layouts, in crew's order."""
    params = []  # (crew name, numpy array)
    cur = list(shape)
    for layer in layers:
        t = layer["type"]
        if t == "dense":
            fan_in, fan_out = cur[-1], layer["units"]
            kshape = (fan_in, fan_out)
            cur[-1] = fan_out
        elif t == "conv2d":
            (kh, kw), (sh, sw) = layer["kernel"], layer["strides"]
            cin, cout = cur[2], layer["filters"]
            kshape, fan_in, fan_out = (kh, kw, cin, cout), kh * kw * cin, kh * kw * cout
            if layer["padding"] == "same":
                cur = [-(-cur[0] // sh), -(-cur[1] // sw), cout]
            else:
                cur = [(cur[0] - kh) // sh + 1, (cur[1] - kw) // sw + 1, cout]
        elif t in ("max_pool2d", "avg_pool2d"):
            (kh, kw), (sh, sw) = layer["pool"], layer["strides"]
            if layer["padding"] == "same":
                cur = [-(-cur[0] // sh), -(-cur[1] // sw), cur[2]]
            else:
                cur = [(cur[0] - kh) // sh + 1, (cur[1] - kw) // sw + 1, cur[2]]
            continue
        elif t == "flatten":
            cur = [int(np.prod(cur))]
            continue
        else:
            continue
        limit = np.sqrt(6.0 / (fan_in + fan_out))
        params.append((layer["name"] + ".kernel", rng.uniform(-limit, limit, kshape).astype(np.float32)))
        if layer.get("bias", True):
            n = kshape[-1]
            params.append((layer["name"] + ".bias", rng.uniform(-0.1, 0.1, (n,)).astype(np.float32)))
    return params


def window(h, layer, pad_value):
    """NHWC -> NCHW with TF-style 'same' padding applied; returns it and the (kh, kw), stride."""
    k = layer["kernel"] if layer["type"] == "conv2d" else layer["pool"]
    s = layer["strides"]
    h = h.permute(0, 3, 1, 2)
    if layer["padding"] == "same":
        top, bottom = same_pads(h.shape[2], k[0], s[0])
        left, right = same_pads(h.shape[3], k[1], s[1])
        h = F.pad(h, (left, right, top, bottom), value=pad_value)
    return h, k, s


def forward(layers, p, x, step):
    """Logits for x [N, H, W, C]; p maps crew names to leaf tensors in crew layouts."""
    h = x
    for layer in layers:
        t, name = layer["type"], layer["name"]
        if t == "dense":
            h = torch.matmul(h, p[name + ".kernel"])
            if name + ".bias" in p:
                h = h + p[name + ".bias"]
        elif t == "conv2d":
            h, _, s = window(h, layer, 0.0)
            h = F.conv2d(h, p[name + ".kernel"].permute(3, 2, 0, 1), stride=tuple(s))
            h = h.permute(0, 2, 3, 1)
            if name + ".bias" in p:
                h = h + p[name + ".bias"]
        elif t == "max_pool2d":
            h, k, s = window(h, layer, float("-inf"))
            h = F.max_pool2d(h, tuple(k), tuple(s)).permute(0, 2, 3, 1)
        elif t == "avg_pool2d":
            if layer["padding"] == "same":
                raise SystemExit("make_reference.py: 'same' average pooling is not supported here")
            h, k, s = window(h, layer, 0.0)
            h = F.avg_pool2d(h, tuple(k), tuple(s)).permute(0, 2, 3, 1)
        elif t == "flatten":
            h = h.reshape(h.shape[0], -1)  # NHWC order, as Keras and crew
        elif t == "dropout":
            cols = int(np.prod(h.shape[1:]))
            mask = dropout_mask(layer["rate"], step, layer["index"], range(h.shape[0]), cols)
            h = h * torch.from_numpy(mask).reshape(h.shape)
        elif t == "activation":
            a = layer["activation"]
            h = {"linear": lambda v: v, "relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
                 "gelu": F.gelu}[a](h)
    return h


# ------------------------------------------------------------------ one fixture

def make_batch(shape, classes, rng):
    """Pixels in [0, 1), normalised with Fashion-MNIST's mean and standard deviation.
    The second half of the batch repeats the first half's images under other labels: a batch of
    8 distinct samples is memorised within a few SGD steps, its loss falls towards 0 and the
    recorded losses become rounding noise (log(1 + tiny)); with every image carrying two labels
    the loss stays near ln 2 or above, where a relative tolerance means something."""
    half = BATCH // 2
    x = ((rng.random((half,) + shape) - 0.2860) / 0.3530).astype(np.float32)
    y = rng.integers(0, classes, half)
    other = (y + rng.integers(1, classes, half)) % classes  # never the same label
    return np.concatenate([x, x]), np.concatenate([y, other]).astype(np.int32)


def reference(index, path):
    shape, layers = load_model(path)
    rng = np.random.default_rng(INIT_SEED + index)  # each model its own numbers
    init = init_params(shape, layers, rng)
    classes = dict(init)[[n for n, _ in init if n.endswith(".kernel")][-1]].shape[-1]
    x, y = make_batch(shape, classes, rng)
    p = {n: torch.tensor(v, requires_grad=True) for n, v in init}
    xt, yt = torch.from_numpy(x), torch.from_numpy(y).long()

    logits = forward(layers, p, xt, 0)
    loss = F.cross_entropy(logits, yt)
    loss.backward()
    grads = {n: p[n].grad.detach().numpy().copy() for n, _ in init}

    # 10 SGD steps on the same batch; step t draws dropout masks with step = t.
    q = {n: torch.tensor(v, requires_grad=True) for n, v in init}
    opt = torch.optim.SGD([q[n] for n, _ in init], lr=LR, momentum=MOMENTUM, nesterov=False)
    losses = []
    for t in range(SGD_STEPS):
        opt.zero_grad()
        step_loss = F.cross_entropy(forward(layers, q, xt, t), yt)
        losses.append(step_loss.item())
        step_loss.backward()
        opt.step()

    tensors = {"x": x, "y": y}
    for n, v in init:
        tensors["init/" + n] = v
    tensors["logits"] = logits.detach().numpy().astype(np.float32)
    tensors["loss"] = np.array([loss.item()], dtype=np.float32)
    for n, _ in init:
        tensors["grad/" + n] = grads[n]
    tensors["sgd_losses"] = np.array(losses, dtype=np.float32)
    dropouts = [f"{layer['name']}:{layer['index']}" for layer in layers if layer["type"] == "dropout"]
    metadata = {
        "model_file": path, "lr": repr(LR), "momentum": repr(MOMENTUM), "nesterov": "false",
        "seed": str(SEED), "init_seed": str(INIT_SEED + index), "batch": str(BATCH), "sgd_steps": str(SGD_STEPS),
        "dropout_layers": ",".join(dropouts), "torch": torch.__version__, "numpy": np.__version__,
        "generator": "tools/make_reference.py",
    }
    return tensors, metadata


def sort_metadata(path):
    """The safetensors library writes "__metadata__" in hash-map order, which changes from run to
    run; rewriting it sorted (same length, same padding) makes a rerun give identical bytes, so
    regenerating the fixtures only changes them when a number changes."""
    with open(path, "rb") as f:
        blob = f.read()
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + n])
    header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
    text = json.dumps(header, separators=(",", ":")).encode()
    assert len(text) <= n, f"{path}: the rewritten header is longer than the original"
    with open(path, "wb") as f:
        f.write(blob[:8] + text + b" " * (n - len(text)) + blob[8 + n:])


def write_and_check(name, tensors, metadata):
    out = os.path.join(OUT_DIR, name + ".safetensors")
    save_file(tensors, out, metadata=metadata)
    sort_metadata(out)
    os.chmod(out, 0o644)  # safetensors creates the file readable by its owner only
    back = load_file(out)
    assert set(back) == set(tensors), f"{out}: tensor names differ after reloading"
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape and np.array_equal(back[k], v), \
            f"{out}: tensor {k} differs after reloading"
    with open(out, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(header_len))
    assert header["__metadata__"] == metadata, f"{out}: metadata differs after reloading"
    return out


def main():
    self_test_rng()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    os.makedirs(OUT_DIR, exist_ok=True)
    for index, (name, path) in enumerate(MODELS):
        tensors, metadata = reference(index, path)
        out = write_and_check(name, tensors, metadata)
        size = os.path.getsize(out)
        losses = " ".join(f"{v:.4f}" for v in tensors["sgd_losses"])
        print(f"{os.path.relpath(out, ROOT)}: {size / 1e6:.2f} MB, loss {tensors['loss'][0]:.6f}, "
              f"dropout {metadata['dropout_layers'] or '-'}, sgd losses {losses}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
