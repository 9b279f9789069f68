#!/usr/bin/env python3
"""Writes the Keras 3 model.to_json() fixtures that tests/test_model_file.c imports.

Run from the repository root:  python3 tools/make_keras_fixtures.py [OUT_DIR]
It prints each model's count_params(); tests/test_model_file.c checks crew counts the same.
Needs keras 3 and one backend (torch by default; KERAS_BACKEND may name another).
"""
import json
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras  # noqa: E402  (the backend must be chosen before the import)
from keras import layers  # noqa: E402

OUT_DIR = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                                              "tests", "fixtures", "keras")


def fashion_mlp():
    m = keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            layers.Flatten(),
            layers.Dense(256, activation="relu"),
            layers.Dense(256, activation="relu"),
            layers.Dense(10, activation="softmax"),
        ],
        name="fashion_mlp",
    )
    m.compile(optimizer=keras.optimizers.Adam(learning_rate=1e-3), loss="sparse_categorical_crossentropy",
              metrics=["accuracy"])
    return m


def small_cnn():
    m = keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            layers.Conv2D(16, 3, padding="same", activation="relu"),
            layers.BatchNormalization(),
            layers.MaxPooling2D(2),
            layers.Conv2D(32, (3, 3), strides=(1, 1), padding="valid", use_bias=False),
            layers.BatchNormalization(momentum=0.9, epsilon=1e-5),
            layers.Activation("relu"),
            layers.AveragePooling2D(pool_size=2),
            layers.GlobalAveragePooling2D(),
            layers.Dropout(0.25),
            layers.Dense(10, activation="softmax"),
        ],
        name="small_cnn",
    )
    m.compile(optimizer=keras.optimizers.SGD(learning_rate=0.01, momentum=0.9, nesterov=True),
              loss="sparse_categorical_crossentropy")
    return m


def token_model():
    m = keras.Sequential(
        [
            keras.Input((12,)),
            layers.Embedding(input_dim=50, output_dim=8),
            layers.LayerNormalization(),
            layers.Flatten(),
            layers.Activation("tanh"),
            layers.Dense(4),
        ],
        name="token_model",
    )
    # No compile: the import must leave crew's defaults unset.
    return m


def functional_cnn():
    """A Functional model whose layers form one chain: crew reads it as the Sequential model it equals."""
    inputs = keras.Input((28, 28, 1), name="image")
    x = layers.Conv2D(8, 3, activation="relu")(inputs)
    x = layers.MaxPooling2D(2)(x)
    x = layers.Flatten()(x)
    x = layers.Dropout(0.1)(x)
    outputs = layers.Dense(10, activation="softmax")(x)
    m = keras.Model(inputs, outputs, name="functional_cnn")
    m.compile(optimizer=keras.optimizers.Adam(learning_rate=1e-3), loss="sparse_categorical_crossentropy")
    return m


def functional_residual():
    """A Functional model with a residual sum: not a chain, which crew refuses naming the layer."""
    inputs = keras.Input((16,), name="features")
    x = layers.Dense(16, activation="relu")(inputs)
    x = layers.Add()([x, inputs])
    outputs = layers.Dense(4)(x)
    return keras.Model(inputs, outputs, name="functional_residual")


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    print("keras", keras.__version__, "backend", keras.backend.backend())
    models = (("fashion_mlp", fashion_mlp), ("small_cnn", small_cnn), ("token_model", token_model),
              ("functional_cnn", functional_cnn), ("functional_residual", functional_residual))
    for name, build in models:
        keras.backend.clear_session()  # each model's layer names start again at dense, dense_1, ...
        model = build()
        text = json.dumps(json.loads(model.to_json()), indent=1, sort_keys=True)
        with open(os.path.join(OUT_DIR, name + ".json"), "w") as f:
            f.write(text + "\n")
        print(f"{name}: count_params={model.count_params()} "
              f"trainable={sum(int(w.numpy().size) for w in model.trainable_weights)} layers={len(model.layers)}")


if __name__ == "__main__":
    main()
