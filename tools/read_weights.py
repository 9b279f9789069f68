#!/usr/bin/env python3
"""read_weights.py — show what a crew weights file (safetensors) holds, from Python.

    python3 tools/read_weights.py model.safetensors [--torch]

Prints the metadata, then one line per tensor: name, dtype, shape, mean, min, max. It parses the
file with NumPy alone (the format is simple enough), and when the `safetensors` package is
installed it also loads the file with safetensors.numpy.load_file and checks that both agree, so
the script doubles as a check that crew writes files the reference reader accepts. With --torch it
also prints the PyTorch layouts (nn.Linear weight [out, in], nn.Conv2d weight [cout, cin, kh, kw]).
"""
import argparse
import json
import struct
import sys

import numpy as np

DTYPES = {"F32": np.float32, "I32": np.int32, "I64": np.int64, "U8": np.uint8,
          "F16": np.float16, "F64": np.float64, "I8": np.int8, "I16": np.int16}


def read_plain(path):
    """(metadata, {name: array}) with NumPy only, checking sizes as crew's reader does."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: {len(raw)} bytes, too short")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > len(raw) - 8:
        raise ValueError(f"{path}: header length {n} exceeds the file")
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    data = memoryview(raw)[8 + n:]
    tensors = {}
    for name, e in header.items():
        dtype = np.dtype(DTYPES[e["dtype"]]).newbyteorder("<")
        begin, end = e["data_offsets"]
        count = int(np.prod(e["shape"], dtype=np.int64))
        if end - begin != count * dtype.itemsize or end > len(data):
            raise ValueError(f"{path}: tensor {name!r}: offsets {begin, end} do not fit shape {e['shape']}")
        tensors[name] = np.frombuffer(data[begin:end], dtype=dtype).reshape(e["shape"])
    return meta, tensors


def torch_layout(name, a):
    """The array as PyTorch stores the same parameter (crew/Keras → torch)."""
    if name.endswith(".kernel") and a.ndim == 2:   # Dense [in, out] → Linear.weight [out, in]
        return "Linear.weight", a.T
    if name.endswith(".kernel") and a.ndim == 4:   # Conv2D [kh, kw, cin, cout] → [cout, cin, kh, kw]
        return "Conv2d.weight", a.transpose(3, 2, 0, 1)
    return None, a


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("path")
    ap.add_argument("--torch", action="store_true", help="also show PyTorch layouts")
    args = ap.parse_args()

    meta, tensors = read_plain(args.path)
    print(f"{args.path}: {len(tensors)} tensors, metadata {json.dumps(meta)}")
    for name, a in tensors.items():
        mean = float(a.astype(np.float64).mean()) if a.size else float("nan")
        lo = a.min() if a.size else float("nan")
        hi = a.max() if a.size else float("nan")
        print(f"  {name:40s} {a.dtype.name:8s} {str(list(a.shape)):18s} mean {mean:+.6f}  min {lo:+.4f}  max {hi:+.4f}")
        if args.torch:
            kind, t = torch_layout(name, a)
            if kind:
                print(f"  {'':40s} as torch {kind}: {list(t.shape)}")

    try:
        from safetensors.numpy import load_file
    except ImportError:
        print("(safetensors not installed: skipped the cross-check with the reference reader)")
        return 0
    ref = load_file(args.path)
    if set(ref) != set(tensors):
        print("MISMATCH: the safetensors package sees other tensor names", file=sys.stderr)
        return 1
    for name, a in tensors.items():
        if ref[name].shape != a.shape or ref[name].dtype != a.dtype or ref[name].tobytes() != a.tobytes():
            print(f"MISMATCH in {name}", file=sys.stderr)
            return 1
    print("safetensors.numpy.load_file reads the same tensors, bit for bit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
