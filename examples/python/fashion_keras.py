"""A Keras model trained by crew on every core: Fashion-MNIST, the demo's CNN written in Keras.

    pip install .            # in crew's repository: libcrew and the crew CLI, built into the package
    pip install keras jax    # Keras 3 and a backend for it (crew trains; Keras describes and evaluates)
    python3 examples/python/fashion_keras.py [--epochs 4] [--devices cpu:2]

The data are the gzipped IDX files of Debian's dataset-fashion-mnist package (what
keras.datasets.fashion_mnist.load_data() downloads), read with NumPy.
"""
import argparse
import gzip
import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import crew  # noqa: E402

SRC = "/usr/share/datasets/fashion-mnist"


def idx(name):
    with gzip.open(os.path.join(SRC, name)) as f:
        data = f.read()
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(data[3])]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * data[3]).reshape(dims)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--devices", default=None, help="crew's devices: cpu (every core), cpu:2, cuda:1, ...")
    p.add_argument("--run-dir", default="runs/fashion-keras")
    a = p.parse_args()

    x_train = idx("train-images-idx3-ubyte.gz")[..., None].astype("float32") / 255.0
    y_train = idx("train-labels-idx1-ubyte.gz")
    x_test = idx("t10k-images-idx3-ubyte.gz")[..., None].astype("float32") / 255.0
    y_test = idx("t10k-labels-idx1-ubyte.gz")

    model = keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dropout(0.3),
        keras.layers.Dense(10, activation="softmax"),
    ], name="fashion_cnn")
    model.compile(optimizer=keras.optimizers.AdamW(1e-3, weight_decay=1e-4),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])

    history = crew.fit(model, x_train, y_train, epochs=a.epochs, batch_size=128, devices=a.devices,
                       validation_data=(x_test, y_test), run_dir=a.run_dir, replace=True)
    loss, accuracy = model.evaluate(x_test, y_test, batch_size=1000, verbose=0)
    print(f"keras evaluate: loss {loss:.4f}, accuracy {accuracy:.4f}; history keys {sorted(history.history)}")


if __name__ == "__main__":
    main()
