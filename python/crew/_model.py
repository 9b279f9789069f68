"""A model for libcrew: from a Keras 3 model (its to_json() and its current weights), a crew or Keras
JSON file, or a dict in crew's JSON format (docs/MODEL_FILES.md), and its weights back.

crew names each tensor "<layer name>.<weight name>" with Keras's shapes ("dense.kernel" [in, out],
"batch_normalization.moving_mean"), which are Keras's own layer and variable names, so a Keras
model's weights map onto crew's one to one; anything that does not is an error naming it.
"""
import ctypes
import json
import os

import numpy as np

from . import _lib
from .errors import InputError


def is_keras(obj):
    return all(hasattr(obj, a) for a in ("to_json", "layers", "get_weights", "name"))


def _keras_variables(model):
    """{"dense.kernel": variable} over the model's layers."""
    out = {}
    for layer in model.layers:
        for v in layer.weights:
            name = v.name.split("/")[-1].split(":")[0]
            out[f"{layer.name}.{name}"] = v
    return out


class Model:
    """A crew_model (handle) and where it came from; close() frees it."""

    def __init__(self, source):
        self.handle = None
        self.keras = source if is_keras(source) else None
        handle = ctypes.c_void_p()
        if self.keras is not None:
            if not source.built or not source.weights:
                raise InputError(f"keras model '{source.name}' has no weights yet: give it an input "
                                 "(keras.Input(shape)) or build it before crew trains it")
            self.text = source.to_json()
            self.what = f"keras model '{source.name}'"
            self.name = source.name
            raw = self.text.encode()
            _lib.check(_lib.lib.crew_model_parse_json(raw, len(raw), self.what.encode(), ctypes.byref(handle)))
        elif isinstance(source, dict):
            self.text = json.dumps(source)
            self.what = "the model dict"
            self.name = source.get("name", "model") if isinstance(source.get("name"), str) else "model"
            raw = self.text.encode()
            _lib.check(_lib.lib.crew_model_parse_json(raw, len(raw), self.what.encode(), ctypes.byref(handle)))
        elif isinstance(source, (str, os.PathLike)):
            path = os.fspath(source)
            self.what = path
            self.name = os.path.basename(path).split(".")[0] or "model"
            _lib.check(_lib.lib.crew_model_load_file(_lib.text(path), ctypes.byref(handle)))
            with open(path, encoding="utf-8") as f:
                self.text = f.read()
        else:
            raise InputError(f"crew takes a Keras 3 model, a model file's path or a dict in crew's model format, "
                             f"not {type(source).__name__}")
        self.handle = handle
        self.classes = _lib.lib.crew_model_output_size(handle)
        self.tensors = []  # (name, shape)
        shape = (ctypes.c_int64 * 8)()
        name = ctypes.create_string_buffer(128)
        for i in range(_lib.lib.crew_model_tensor_count(handle)):
            nd = _lib.lib.crew_model_tensor_info(handle, i, name, 128, shape)
            self.tensors.append((name.value.decode(), tuple(shape[:nd])))
        if self.keras is not None:
            self.set(self._from_keras())

    # ---------------------------------------------------------------- weights

    def _from_keras(self):
        found = _keras_variables(self.keras)
        values = {}
        for name, shape in self.tensors:
            v = found.pop(name, None)
            if v is None:
                raise InputError(f"{self.what}: crew's tensor '{name}' has no Keras weight of that name")
            a = np.asarray(v.numpy() if hasattr(v, "numpy") else v, dtype=np.float32)
            if a.shape != shape:
                raise InputError(f"{self.what}: weight '{name}' has shape {a.shape} in Keras, {shape} in crew")
            values[name] = a
        if found:
            raise InputError(f"{self.what}: Keras weight '{next(iter(found))}' has no tensor in crew's model")
        return values

    def set(self, values):
        """Sets every tensor from values {name: array}."""
        arrays = [np.ascontiguousarray(values[name], dtype=np.float32).reshape(shape) for name, shape in self.tensors]
        ptrs = (ctypes.POINTER(ctypes.c_float) * max(1, len(arrays)))(
            *[a.ctypes.data_as(ctypes.POINTER(ctypes.c_float)) for a in arrays])
        _lib.check(_lib.lib.crew_model_set_tensors(self.handle, ptrs))

    def get(self):
        """Every tensor, {name: float32 array} in crew's order."""
        arrays = [np.empty(shape, dtype=np.float32) for _, shape in self.tensors]
        ptrs = (ctypes.POINTER(ctypes.c_float) * max(1, len(arrays)))(
            *[a.ctypes.data_as(ctypes.POINTER(ctypes.c_float)) for a in arrays])
        _lib.check(_lib.lib.crew_model_get_tensors(self.handle, ptrs))
        return {name: a for (name, _), a in zip(self.tensors, arrays)}

    def to_keras(self, values=None):
        """The crew model's weights (or `values`) into the Keras model's variables."""
        values = self.get() if values is None else values
        found = _keras_variables(self.keras)
        for name, a in values.items():
            found[name].assign(a)

    def close(self):
        if self.handle:
            _lib.lib.crew_model_free(self.handle)
            self.handle = None

    def __del__(self):
        self.close()
