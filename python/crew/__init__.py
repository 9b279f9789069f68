"""crew from Python: a Keras model trained on every core, GPU or machine you have, with one call.

    import crew
    history = crew.fit(model, x_train, y_train, epochs=5, batch_size=256,
                       validation_data=(x_test, y_test))          # every core of this machine
    model.evaluate(x_test, y_test)                                 # the trained weights are in model

crew.fit trains through libcrew (the library behind the crew command line): the same plan,
progress, run directory (metrics.jsonl, TensorBoard, report.html, checkpoints), the same events,
and the same weights, bit for bit, on any number of devices. docs/PYTHON.md has the details.
"""
import ctypes

import numpy as np

from . import _lib
from ._cli import run_verb
from ._data import dataset
from ._fit import History, fit
from ._model import Model
from .errors import CrewError, InputError, TrainingError

__all__ = ["fit", "evaluate", "predict", "load_weights", "save_weights", "verify", "plan", "scale", "History", "CrewError",
           "InputError", "TrainingError", "version"]


def version():
    """libcrew's version."""
    return _lib.lib.crew_version().decode()


__version__ = version()


def evaluate(model, x, y=None, *, batch_size=256):
    """crew's own evaluation of model (with its current weights) on arrays or a dataset directory's
    test split: {"loss": ..., "accuracy": ..., "samples": ...}."""
    m = Model(model)
    try:
        d = dataset(m, x, y, "x", split="test")
        try:
            r = _lib.Struct("crew_eval_result")
            _lib.check(_lib.lib.crew_model_evaluate(m.handle, d.handle, int(batch_size), r.ptr))
            return r.dict()
        finally:
            d.close()
    finally:
        m.close()


def predict(model, x):
    """Class probabilities [n, classes] of model (its current weights) for float32 samples x."""
    m = Model(model)
    try:
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = np.empty((len(x), m.classes), dtype=np.float32)
        fp = ctypes.POINTER(ctypes.c_float)
        _lib.check(_lib.lib.crew_model_predict(m.handle, x.ctypes.data_as(fp), len(x), out.ctypes.data_as(fp)))
        return out
    finally:
        m.close()


def load_weights(model, path):
    """A crew weights file (a run's weights.safetensors, a checkpoint's model.safetensors) into the
    Keras model; for another kind of model, the weights as a dict {name: array}."""
    m = Model(model)
    try:
        _lib.check(_lib.lib.crew_model_load_weights(m.handle, _lib.text(path)))
        values = m.get()
        if m.keras is not None:
            m.to_keras(values)
        return values
    finally:
        m.close()


def save_weights(model, path):
    """The model's current weights (a Keras model's, say) as a crew weights file (safetensors): what
    `crew train --init-weights` starts from, and crew.load_weights reads."""
    m = Model(model)
    try:
        _lib.check(_lib.lib.crew_model_save_weights(m.handle, _lib.text(path)))
    finally:
        m.close()


def verify(model, x, y=None, *, devices="cpu:2", **flags):
    """crew verify: N replicas compute what one computes (docs/VERIFY.md); crew verify's --json
    dict, whose "pass" is the verdict. Flags as keywords: steps=20, shard_optimizer=True."""
    return run_verb("verify", model, x, y, devices=devices, **flags)


def plan(model, *, devices=None, x=None, y=None, **flags):
    """crew plan: what one replica needs and which layout fits (docs/ADVISOR.md); its --json dict.
    Flags as keywords: batch_per_device=64, device_memory="8G", precision="bf16"; from_=history (a
    crew.fit's History, or a run directory) adds its gradient noise scale against the planned
    global batch (the dict's "noise")."""
    return run_verb("plan", model, x, y, devices=devices, **flags)


def scale(model, x, y=None, *, devices=None, **flags):
    """crew scale: measured scaling and whether more devices pay (docs/ADVISOR.md); its --json dict.
    from_=history (a crew.fit's History, or a run directory) projects with that run's gradient noise
    scale: each point's statistical_efficiency, goodput and to_target_s, and pays_until_devices."""
    return run_verb("scale", model, x, y, devices=devices, **flags)
