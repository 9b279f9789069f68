"""Shared by the Python package's tests: Keras on JAX's CPU backend (real Keras 3, no mocks),
Fashion-MNIST from Debian's dataset-fashion-mnist package, and small models built the same way
every time (a fixed seed: the same initial weights in every run)."""
import gzip
import os
import subprocess
import sys

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import crew  # noqa: E402

FASHION = os.environ.get("CREW_FASHION_MNIST", "/usr/share/datasets/fashion-mnist")
SOURCE = os.environ.get("CREW_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))


def _idx(path):
    with gzip.open(path) as f:
        data = f.read()
    nd = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(nd)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * nd).reshape(dims)


@pytest.fixture(scope="session")
def fashion():
    """Fashion-MNIST as Keras users hold it: float32 images in [0, 1] [n, 28, 28, 1], uint8 labels."""
    if not os.path.isdir(FASHION):
        pytest.skip("dataset-fashion-mnist is not installed")
    x = _idx(f"{FASHION}/train-images-idx3-ubyte.gz")[..., None].astype(np.float32) / 255.0
    y = _idx(f"{FASHION}/train-labels-idx1-ubyte.gz")
    xt = _idx(f"{FASHION}/t10k-images-idx3-ubyte.gz")[..., None].astype(np.float32) / 255.0
    yt = _idx(f"{FASHION}/t10k-labels-idx1-ubyte.gz")
    return x, y, xt, yt


def mlp(seed=1, optimizer="adam"):
    import keras

    keras.backend.clear_session()  # layer names from "dense" again: crew's weights files name tensors by layer
    keras.utils.set_random_seed(seed)
    m = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(),
                          keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10, activation="softmax")],
                         name="mlp")
    opt = keras.optimizers.Adam(1e-3) if optimizer == "adam" else keras.optimizers.SGD(0.05, momentum=0.9)
    m.compile(optimizer=opt, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return m


def cnn(seed=1):
    import keras

    keras.backend.clear_session()
    keras.utils.set_random_seed(seed)
    m = keras.Sequential([keras.Input((28, 28, 1)),
                          keras.layers.Conv2D(8, 3, activation="relu"), keras.layers.MaxPooling2D(2),
                          keras.layers.Conv2D(16, 3, activation="relu"), keras.layers.MaxPooling2D(2),
                          keras.layers.Flatten(), keras.layers.Dense(10, activation="softmax")], name="cnn")
    m.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return m


def weights(model):
    return [np.array(w) for w in model.get_weights()]


def same_bits(a, b):
    return len(a) == len(b) and all(x.shape == y.shape and x.tobytes() == y.tobytes() for x, y in zip(a, b))


def crew_cli(*args, check=True):
    """The crew command line installed with the package."""
    p = subprocess.run([crew._cli.executable(), *map(str, args)], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"crew {' '.join(map(str, args))} exited {p.returncode}: {p.stderr}")
    return p
