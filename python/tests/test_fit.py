"""crew.fit on Keras models and Fashion-MNIST, against the crew command line and against itself.

- a Keras MLP and a Keras CNN trained by crew.fit end with the weights (so the test accuracy) of
  `crew train` on the same arrays (crew prep arrays), seed and starting weights, bit for bit, and
  Keras's own model.evaluate agrees with crew's evaluation;
- 2 replicas equal 1 replica accumulating 2 micro-batches, bit for bit, and 2 replicas sharding their
  gradients or parameters (shard=) equal 2 unsharded ones, as do loader threads and batches prepared
  on the replicas' own threads (loader_inline=);
- a Functional model, a model file, the History Keras returns, Keras callbacks;
- the run directory holds what crew train leaves there.
"""
import json
import os

import numpy as np
import pytest

import crew
from conftest import cnn, crew_cli, mlp, same_bits, weights


def _cli_run(tmp_path, build, x, y, xt, yt, devices, batch, seed):
    """crew train on the arrays (saved and prepared as crew prep arrays would) from the Keras model's
    starting weights: the trained weights, loaded into a fresh Keras model, and its JSON line."""
    for name, a in (("x", x), ("y", y), ("xt", xt), ("yt", yt)):
        np.save(tmp_path / f"{name}.npy", a)
    crew_cli("prep", "arrays", tmp_path / "x.npy", tmp_path / "y.npy", "--test-x", tmp_path / "xt.npy",
             "--test-y", tmp_path / "yt.npy", "--out", tmp_path / "data")
    start = build()
    (tmp_path / "model.json").write_text(start.to_json())
    crew.save_weights(start, tmp_path / "start.safetensors")
    replicas = int(devices.split(":")[1])
    p = crew_cli("train", tmp_path / "model.json", "--data", tmp_path / "data", "--devices", devices,
                 "--global-batch", batch, "--batch-per-device", batch // replicas, "--seed", seed, "--init-weights", tmp_path / "start.safetensors",
                 "--run-dir", tmp_path / "cli-run", "--epochs", 1, "--quiet", "--json")
    trained = build()
    crew.load_weights(trained, tmp_path / "cli-run" / "weights.safetensors")
    return trained, json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("build", [mlp, cnn], ids=["mlp", "cnn"])
def test_fit_equals_the_cli(tmp_path, fashion, build):
    x, y, xt, yt = fashion
    model = build()
    history = crew.fit(model, x, y, epochs=1, batch_size=128, devices="cpu:2", seed=5, validation_data=(xt, yt),
                       run_dir=tmp_path / "py-run", verbose=0)
    cli_model, cli = _cli_run(tmp_path, build, x, y, xt, yt, "cpu:2", 128, 5)
    assert same_bits(weights(model), weights(cli_model)), "crew.fit and crew train ended with other weights"
    assert abs(history.history["val_accuracy"][-1] - cli["test_accuracy"]) <= 0.005
    assert history.history["val_accuracy"][-1] > 0.70
    # Keras's own evaluation of the weights crew.fit put back, against crew's of the same weights
    loss, accuracy = model.evaluate(xt, yt, batch_size=500, verbose=0)
    ours = crew.evaluate(model, xt, yt)
    assert abs(loss - ours["loss"]) <= 1e-5 and abs(accuracy - ours["accuracy"]) <= 1e-4
    assert abs(loss - history.history["val_loss"][-1]) <= 1e-5


def test_replicas_equal_one_accumulating(tmp_path, fashion):
    x, y, _, _ = fashion
    two, one = mlp(), mlp()
    crew.fit(two, x[:6400], y[:6400], epochs=2, batch_size=64, devices="cpu:2", run_dir=tmp_path / "two", verbose=0)
    crew.fit(one, x[:6400], y[:6400], epochs=2, batch_size=64, batch_per_device=32, devices="cpu:1",
             run_dir=tmp_path / "one", verbose=0)
    assert same_bits(weights(two), weights(one))
    plan = json.loads((tmp_path / "one" / "config.json").read_text())["plan"]
    assert plan["accumulation_steps"] == 2 and plan["global_batch"] == 64 and plan["batch_per_device"] == 32


def test_loader_threads_or_inline(tmp_path, fashion):
    """loader_threads= asks for loader threads (as --loader-threads does), loader_inline="on" for each
    replica preparing its own batches: config.json says which, and the weights are the same bits."""
    x, y, _, _ = fashion
    threads, inline = mlp(), mlp()
    crew.fit(threads, x[:3200], y[:3200], epochs=1, batch_size=64, devices="cpu:2", loader_threads=2,
             run_dir=tmp_path / "threads", verbose=0)
    crew.fit(inline, x[:3200], y[:3200], epochs=1, batch_size=64, devices="cpu:2", loader_inline="on",
             run_dir=tmp_path / "inline", verbose=0)
    assert same_bits(weights(threads), weights(inline))
    for name, want in (("threads", "threads"), ("inline", "inline")):
        assert json.loads((tmp_path / name / "config.json").read_text())["plan"]["loader"] == want


@pytest.mark.parametrize("shard", ["gradients", "parameters"])
def test_sharded_replicas_equal_unsharded(tmp_path, fashion, shard):
    """shard= is crew train's --shard: ZeRO-2 and 3 keep the weights of the unsharded run, bit for bit
    (in units of 0.1 MiB: the first dense layer one, the second another)."""
    x, y, _, _ = fashion
    sharded, plain = mlp(), mlp()
    crew.fit(sharded, x[:3200], y[:3200], epochs=1, batch_size=64, devices="cpu:2", shard=shard, shard_unit_mb=0.1,
             run_dir=tmp_path / "sharded", verbose=0)
    crew.fit(plain, x[:3200], y[:3200], epochs=1, batch_size=64, devices="cpu:2", run_dir=tmp_path / "plain", verbose=0)
    assert same_bits(weights(sharded), weights(plain))
    plan = json.loads((tmp_path / "sharded" / "config.json").read_text())["plan"]
    assert plan["shard"] == shard and plan["shard_units"] >= 2


def test_history_and_run_directory(tmp_path, fashion, capsys):
    x, y, xt, yt = fashion
    model = mlp()
    history = crew.fit(model, x[:4096], y[:4096], epochs=3, batch_size=256, devices="cpu:2",
                       validation_data=(xt[:1000], yt[:1000]), run_dir=tmp_path / "run", verbose=2)
    import keras

    assert isinstance(history, keras.callbacks.History)
    assert sorted(history.history) == ["accuracy", "loss", "val_accuracy", "val_loss"]
    assert all(len(v) == 3 for v in history.history.values()) and history.epoch == [0, 1, 2]
    assert history.history["loss"][2] < history.history["loss"][0]
    out = capsys.readouterr().out
    assert "plan: cpu:2 (2 replicas x 1 BLAS thread), batch 128 per device x 1 accumulation = global batch 256" in out
    assert out.count("Epoch ") == 3 and "val_accuracy" in out and f"run directory: {tmp_path / 'run'}" in out
    for name in ("config.json", "metrics.jsonl", "report.html", "weights.safetensors", "tb", "checkpoints"):
        assert (tmp_path / "run" / name).exists(), name
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["model"] == "keras model 'mlp'" and config["front_end"].startswith("crew.fit, python")
    assert config["data"] == "arrays x [4096, 28, 28, 1] float32"
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert sum('"type":"step"' in line for line in lines) == 3 * 16


def test_verbose_zero_is_silent(tmp_path, fashion, capsys):
    x, y, _, _ = fashion
    crew.fit(mlp(), x[:1024], y[:1024], batch_size=128, devices="cpu:1", run_dir=tmp_path / "r", verbose=0)
    assert capsys.readouterr().out == ""


def test_functional_model_and_files(tmp_path, fashion):
    import keras

    x, y, xt, yt = fashion
    keras.backend.clear_session()
    keras.utils.set_random_seed(2)
    inputs = keras.Input((28, 28, 1))
    h = keras.layers.Flatten()(inputs)
    h = keras.layers.Dense(32, activation="relu")(h)
    outputs = keras.layers.Dense(10, activation="softmax")(h)
    functional = keras.Model(inputs, outputs, name="fn")
    functional.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    before = weights(functional)
    crew.fit(functional, x[:2048], y[:2048], batch_size=128, devices="cpu:2", run_dir=tmp_path / "fn", verbose=0)
    assert not same_bits(before, weights(functional)), "the trained weights went back into the Keras model"
    # a model file, and a dict in crew's format: History.weights holds the trained tensors
    spec = {"input_shape": [28, 28, 1], "layers": [{"type": "flatten"}, {"type": "dense", "units": 10}]}
    h = crew.fit(spec, x[:2048], y[:2048], batch_size=128, devices="cpu:1", run_dir=tmp_path / "dict", verbose=0)
    assert isinstance(h, crew.History) and h.weights["dense.kernel"].shape == (784, 10)
    (tmp_path / "m.json").write_text(json.dumps(spec))
    h2 = crew.fit(str(tmp_path / "m.json"), x[:2048], y[:2048], batch_size=128, devices="cpu:1",
                  run_dir=tmp_path / "file", verbose=0)
    assert same_bits(list(h.weights.values()), list(h2.weights.values()))


def test_keras_callbacks_and_early_stopping(tmp_path, fashion):
    import keras

    x, y, xt, yt = fashion
    seen = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(("batch", batch, round(logs["loss"], 6)))

        def on_epoch_end(self, epoch, logs=None):
            seen.append(("epoch", epoch, sorted(logs)))

    stop = keras.callbacks.EarlyStopping(monitor="val_loss", patience=0, min_delta=10.0)  # stops after epoch 2
    model = mlp()
    h = crew.fit(model, x[:1024], y[:1024], epochs=5, batch_size=128, devices="cpu:2",
                 validation_data=(xt[:512], yt[:512]), run_dir=tmp_path / "cb", verbose=0, callbacks=[Record(), stop])
    batches = [s for s in seen if s[0] == "batch"]
    assert batches[0][1] == 0 and batches[7][1] == 7 and len(batches) >= 16
    assert seen[8] == ("epoch", 0, ["accuracy", "loss", "val_accuracy", "val_loss"])
    assert len(h.history["loss"]) == 2, "EarlyStopping ends the run after its epoch, as in Keras"
    steps = [json.loads(line)["step"] for line in open(tmp_path / "cb" / "metrics.jsonl") if '"type":"step"' in line]
    assert steps[-1] == 16, f"the run stopped after step {steps[-1]}, not at the end of epoch 2 (step 16)"

    class Broken(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:
                raise RuntimeError("a callback's own error")

    with pytest.raises(RuntimeError, match="a callback's own error"):
        crew.fit(mlp(), x[:1024], y[:1024], batch_size=128, devices="cpu:1", run_dir=tmp_path / "broken",
                 verbose=0, callbacks=[Broken()])


def test_arrays_are_read_in_place(fashion):
    from crew import _data

    x, y, _, _ = fashion
    assert _data._samples(x, "x") is x, "float32 in C order goes to libcrew as it is"
    u8 = (x * 255).astype(np.uint8)
    assert _data._samples(u8, "x") is u8 and _data._labels(y, len(y), "x") is y
    assert _data._samples(x.astype(np.float64), "x").dtype == np.float32  # converted, as Keras does


def test_uint8_samples_and_a_dataset_directory(tmp_path, fashion):
    x, y, xt, yt = fashion
    u8 = np.round(x[:2048] * 255).astype(np.uint8)
    a, b = mlp(), mlp()
    crew.fit(a, u8, y[:2048], batch_size=128, devices="cpu:2", run_dir=tmp_path / "u8", verbose=0)
    crew.fit(b, u8.astype(np.float32), y[:2048], batch_size=128, devices="cpu:2", run_dir=tmp_path / "f32", verbose=0)
    assert same_bits(weights(a), weights(b)), "uint8 samples reach the model as the same values in float32"
    crew_cli("prep", "fashion-mnist", "--out", tmp_path / "fm")
    h = crew.fit(mlp(), str(tmp_path / "fm"), epochs=1, batch_size=256, devices="cpu:2", run_dir=tmp_path / "dir",
                 verbose=0, max_steps=20)
    assert "val_accuracy" in h.history, "a dataset directory brings its test split"


def test_predict_and_weights_files(tmp_path, fashion):
    x, y, xt, yt = fashion
    model = mlp()
    crew.fit(model, x[:2048], y[:2048], batch_size=128, devices="cpu:2", run_dir=tmp_path / "r", verbose=0)
    ours = crew.predict(model, xt[:64])
    theirs = model.predict(xt[:64], verbose=0)
    assert np.abs(ours - theirs).max() < 1e-5 and ours.shape == (64, 10)
    fresh = mlp(seed=4)
    values = crew.load_weights(fresh, tmp_path / "r" / "weights.safetensors")
    assert same_bits(weights(fresh), weights(model)) and "dense.kernel" in values
    crew.save_weights(fresh, tmp_path / "again.safetensors")
    again = mlp(seed=5)
    crew.load_weights(again, tmp_path / "again.safetensors")
    assert same_bits(weights(again), weights(model))
