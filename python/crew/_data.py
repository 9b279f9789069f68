"""NumPy arrays as crew datasets, read where they are (crew_dataset_from_arrays).

uint8 and float32 samples in C order are handed to libcrew as they are, without a copy; other
numeric dtypes (float64 after an x / 255.0, say) become float32 first, a copy, as Keras's fit
converts them too. Labels are class indices: uint8 and int32 pass as they are, other integer
dtypes are converted to int32 (n · 4 bytes). The values reach the model unchanged, as in Keras.
"""
import ctypes
import os

import numpy as np

from . import _lib
from .errors import InputError

ARRAY_U8, ARRAY_I32, ARRAY_F32 = 1, 2, 3


def _samples(x, name):
    x = np.asarray(x)
    if x.dtype == np.uint8 or x.dtype == np.float32:
        return np.ascontiguousarray(x)
    if x.dtype.kind in "iuf" and x.dtype.itemsize <= 8:
        return np.ascontiguousarray(x, dtype=np.float32)
    raise InputError(f"{name}: the samples are {x.dtype}; crew takes numbers (uint8 and float32 are read in place, "
                     "other numeric dtypes as float32)")


def _labels(y, n, name):
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim == 2:
        raise InputError(f"{name}: the labels have shape {y.shape}: crew takes class indices, one a sample (one-hot "
                         "labels become indices with np.argmax(y, axis=1))")
    if y.ndim != 1:
        raise InputError(f"{name}: the labels have shape {y.shape}; crew takes one class index a sample")
    if y.dtype.kind not in "iu":
        raise InputError(f"{name}: the labels are {y.dtype}; crew takes integer class indices "
                         "(sparse_categorical_crossentropy's labels)")
    if len(y) != n:
        raise InputError(f"{name}: {n} samples but {len(y)} labels")
    if y.dtype == np.uint8 or y.dtype == np.int32:
        return np.ascontiguousarray(y)
    if len(y) and (y.min() < -(2 ** 31) or y.max() >= 2 ** 31):
        raise InputError(f"{name}: label {int(y.max() if y.max() >= 2 ** 31 else y.min())} is not a class index")
    return np.ascontiguousarray(y, dtype=np.int32)


class Dataset:
    """A crew_dataset over arrays or a dataset directory's split; keeps its arrays alive."""

    def __init__(self, handle, size, keep=(), what=""):
        self.handle = handle
        self.size = size
        self._keep = keep
        self.what = what

    @classmethod
    def from_arrays(cls, x, y, classes, name):
        if y is None:
            raise InputError(f"{name}: samples without labels: give y (class indices)")
        x = _samples(x, name)
        if x.ndim < 2:
            raise InputError(f"{name}: an array of shape {x.shape}; crew takes [samples, ...]")
        y = _labels(y, len(x), name)
        shape = (ctypes.c_int64 * (x.ndim - 1))(*x.shape[1:])
        a = _lib.Struct("crew_arrays")
        a["x"] = x.ctypes.data
        a["x_type"] = ARRAY_U8 if x.dtype == np.uint8 else ARRAY_F32
        a["sample_shape"] = ctypes.addressof(shape)
        a["sample_ndim"] = x.ndim - 1
        a["y"] = y.ctypes.data
        a["y_type"] = ARRAY_U8 if y.dtype == np.uint8 else ARRAY_I32
        a["n"] = len(x)
        a["classes"] = int(classes)
        a["name"] = name
        handle = ctypes.c_void_p()
        _lib.check(_lib.lib.crew_dataset_from_arrays(a.ptr, ctypes.byref(handle)))
        dims = ", ".join(str(d) for d in x.shape)
        return cls(handle, len(x), keep=(x, y, shape, a), what=f"arrays {name} [{dims}] {x.dtype}")

    @classmethod
    def from_dir(cls, model, path, split):
        handle = ctypes.c_void_p()
        _lib.check(_lib.lib.crew_dataset_open_for(model.handle, _lib.text(path), split.encode(), ctypes.byref(handle)))
        note = _lib.lib.crew_dataset_note(handle)
        d = cls(handle, _lib.lib.crew_dataset_size(handle), what=os.fspath(path))
        d.note = note.decode() if note else ""
        return d

    def arrays(self):
        """The arrays (x, y) this dataset reads, or None for a directory's."""
        return self._keep[:2] if self._keep else None

    def close(self):
        if self.handle:
            _lib.lib.crew_dataset_free(self.handle)
            self.handle = None

    def __del__(self):
        self.close()


def dataset(model, x, y, name, split="train"):
    """x, y as a Dataset: arrays (y the labels), or a dataset directory (y None) and its split."""
    if isinstance(x, (str, os.PathLike)):
        if y is not None:
            raise InputError(f"{name}: a dataset directory ({os.fspath(x)}) holds its labels: give no y")
        return Dataset.from_dir(model, x, split)
    return Dataset.from_arrays(x, y, model.classes, name)


def write_dir(x, y, classes, out_dir, name="x"):
    """The arrays as a dataset directory with a train split only (crew prep arrays), for the CLI's
    verbs that read one (crew verify, crew scale)."""
    d = Dataset.from_arrays(x, y, classes, name)
    try:
        a = d._keep[3]
        _lib.check(_lib.lib.crew_prep_arrays(a.ptr, None, 0.0, 0, _lib.text(out_dir), None, None))
    finally:
        d.close()
