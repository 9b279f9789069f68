"""Bad input raises one clear exception before anything is written into the run directory; a run
that fails once it started raises TrainingError naming what failed."""
import os

import numpy as np
import pytest

import crew
from conftest import mlp


def _refused(tmp_path, exc, match, model, x, y, **kw):
    run = tmp_path / "run"
    with pytest.raises(exc, match=match):
        crew.fit(model, x, y, run_dir=run, verbose=0, **kw)
    assert not run.exists(), f"{run} was made for a refused fit"


def test_bad_inputs_write_nothing(tmp_path, fashion):
    x, y, _, _ = fashion
    x, y = x[:256], y[:256]
    _refused(tmp_path, ValueError, "the samples are <U1", mlp(), np.full((256, 28, 28, 1), "a"), y)
    _refused(tmp_path, ValueError, "the labels are float32; crew takes integer class indices", mlp(), x,
             y.astype(np.float32))
    _refused(tmp_path, ValueError, "x: 256 samples but 255 labels", mlp(), x, y[:255])
    bad = x.copy()
    bad[17, 3, 4, 0] = np.nan
    _refused(tmp_path, ValueError, "x: sample 17 holds NaN at value 88", mlp(), bad, y)
    wrong = y.astype(np.int64)
    wrong[5] = 10
    _refused(tmp_path, ValueError, r"x: label 10 of sample 5 is outside \[0, 10\)", mlp(), x, wrong)
    _refused(tmp_path, ValueError, "one-hot labels become indices", mlp(), x, np.eye(10)[y])
    _refused(tmp_path, ValueError, r"dataset x \(arrays\) has samples of shape \(784,\) but the model takes \(28, 28, 1\)", mlp(),
             x.reshape(256, 784), y)
    _refused(tmp_path, ValueError, "does not split evenly across 3 replicas", mlp(), x, y, batch_size=128,
             devices="cpu:3")
    _refused(tmp_path, ValueError, "unknown device kind|kinds", mlp(), x, y, devices="tpu:2")
    _refused(tmp_path, TypeError, "unexpected keyword argument 'learning_rate'", mlp(), x, y, learning_rate=0.1)
    _refused(tmp_path, ValueError, "precision takes one of fp32, bf16", mlp(), x, y, precision="fp16")
    _refused(tmp_path, ValueError, "bind_cores takes one of auto, on, off", mlp(), x, y, bind_cores="always")
    _refused(tmp_path, ValueError, "loader_inline takes one of auto, on, off", mlp(), x, y, loader_inline="yes")
    val = (x[:10], y[:9])
    _refused(tmp_path, ValueError, "validation_data: 10 samples but 9 labels", mlp(), x, y, validation_data=val)


def test_unsupported_keras_layer_is_named(tmp_path, fashion):
    import keras

    x, y, _, _ = fashion
    keras.backend.clear_session()
    m = keras.Sequential([keras.Input((28, 28)), keras.layers.LSTM(8, name="recurrent"), keras.layers.Dense(10)])
    _refused(tmp_path, ValueError, "layer 1 .*recurrent.*LSTM", m, x[:64, :, :, 0], y[:64])
    keras.backend.clear_session()
    m = keras.Sequential([keras.layers.Dense(10)])  # never built: no weights to start from
    _refused(tmp_path, ValueError, "has no weights yet", m, x[:64], y[:64])


def test_another_run_is_not_overwritten(tmp_path, fashion):
    x, y, _, _ = fashion
    run = tmp_path / "run"
    crew.fit(mlp(), x[:256], y[:256], batch_size=64, devices="cpu:1", run_dir=run, verbose=0)
    before = (run / "metrics.jsonl").read_bytes()
    with pytest.raises(ValueError, match="holds another run .* resume=.* replace=True"):
        crew.fit(mlp(), x[:256], y[:256], batch_size=64, devices="cpu:1", run_dir=run, verbose=0)
    assert (run / "metrics.jsonl").read_bytes() == before
    crew.fit(mlp(), x[:256], y[:256], batch_size=64, devices="cpu:1", run_dir=run, verbose=0, replace=True)


def test_run_failure_is_a_training_error(tmp_path, fashion):
    x, y, _, _ = fashion
    huge = mlp()
    with pytest.raises(crew.TrainingError, match="NaN|non-finite|not finite"):
        crew.fit(huge, x[:512], y[:512], batch_size=64, devices="cpu:2", run_dir=tmp_path / "nan", verbose=0,
                 lr=1e30)
    assert issubclass(crew.TrainingError, RuntimeError) and issubclass(crew.InputError, ValueError)
