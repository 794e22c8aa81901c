"""Model builders: a small CNN for tests and CPUs, and Keras applications trained from scratch."""

import keras


def small_cnn(input_shape, num_classes: int) -> keras.Model:
    """Three conv blocks and a softmax: enough for digits, cheap enough for a CPU test."""
    inputs = keras.Input(input_shape, name="image")
    x = inputs
    for filters in (32, 64, 128):
        x = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False)(x)
        x = keras.layers.BatchNormalization(momentum=0.9)(x)  # short runs: moving stats must settle within a few hundred steps
        x = keras.layers.ReLU()(x)
        x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dropout(0.2)(x)
    return keras.Model(inputs, _head(x, num_classes), name="small_cnn")


def _head(x, num_classes: int):
    # float32 softmax even under mixed_float16: float16 probabilities underflow and the loss
    # turns inaccurate.
    return keras.layers.Dense(num_classes, activation="softmax", dtype="float32", name="probabilities")(x)


def _application(factory, input_shape, num_classes: int, name: str) -> keras.Model:
    # weights=None: no download, and the input may have 1 channel; our own head so the
    # softmax stays float32 (see _head).
    base = factory(include_top=False, weights=None, input_shape=tuple(input_shape), pooling="avg")
    return keras.Model(base.input, _head(base.output, num_classes), name=name)


def mobilenet_v2(input_shape, num_classes: int) -> keras.Model:
    """keras.applications.MobileNetV2 from scratch (input side at least 32)."""
    return _application(keras.applications.MobileNetV2, input_shape, num_classes, "mobilenet_v2")


def resnet50(input_shape, num_classes: int) -> keras.Model:
    """keras.applications.ResNet50 from scratch (input side at least 32)."""
    return _application(keras.applications.ResNet50, input_shape, num_classes, "resnet50")


MODELS = {"small_cnn": small_cnn, "mobilenet_v2": mobilenet_v2, "resnet50": resnet50}
_MIN_SIDE = {"small_cnn": 8, "mobilenet_v2": 32, "resnet50": 32}


def build(name: str, image_size: int, channels: int, num_classes: int) -> keras.Model:
    """The model called `name` for square images of `image_size` with `channels` channels."""
    key = name.lower().replace("-", "_")
    aliases = {"mobilenetv2": "mobilenet_v2", "resnet": "resnet50"}
    key = aliases.get(key, key)
    if key not in MODELS:
        raise ValueError(f"unknown --model {name!r}; choose one of {sorted(MODELS)}")
    if image_size < _MIN_SIDE[key]:
        raise ValueError(f"--image_size {image_size} is too small for {key}; use at least {_MIN_SIDE[key]}")
    return MODELS[key]((image_size, image_size, channels), num_classes)
