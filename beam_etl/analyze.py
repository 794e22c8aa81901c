"""The tf.Transform graph that travels with a dataset: label vocabulary and per-channel pixel statistics.

The statistics come from Beam combiners over the training split (trainstats.py), so the
conversion's workers need no TensorFlow; write_transform bakes them into the graph once.
"""

import json
import os

import tensorflow as tf
import tensorflow_transform as tft

from beam_etl import trainstats

LABEL_VOCABULARY = trainstats.LABEL_VOCABULARY
FREQUENCY_VOCABULARY = trainstats.FREQUENCY_VOCABULARY


def raw_feature_spec(channels: int) -> dict:
    """The transform graph's inputs as TensorFlow feature specs (trainstats.transform_contract)."""
    inputs = trainstats.transform_contract(channels)["inputs"]
    return {name: tf.io.FixedLenFeature(spec["shape"], tf.as_dtype(spec["dtype"])) for name, spec in inputs.items()}


def make_preprocessing_fn(label_names, summary: dict):
    """The graph: label ids in sorted-name order, and the training split's pixel mean and std per channel.

    No tf.Transform analyzer is left in it: the statistics are constants from trainstats,
    computed by Beam combiners, so tf.Transform writes it in place with no Beam pipeline.
    """
    label_names = list(label_names)
    mean_values = [float(v) for v in summary["pixel_mean"]]
    sq_mean_values = [float(v) for v in summary["pixel_sq_mean"]]

    def preprocessing_fn(inputs):
        # A label's id is its position in the sorted names (the records' ids); -1 for any
        # other text, as tft.apply_vocabulary gives for a token not in its vocabulary.
        names = tf.constant(label_names)
        matches = tf.equal(tf.expand_dims(inputs["label_text"], -1), names)
        label = tf.where(tf.reduce_any(matches, axis=-1), tf.argmax(tf.cast(matches, tf.int64), axis=-1), tf.constant(-1, tf.int64))
        mean = tf.constant(mean_values, tf.float32)
        sq_mean = tf.constant(sq_mean_values, tf.float32)
        std = tf.sqrt(tf.maximum(sq_mean - tf.square(mean), 1e-6))
        rows = tf.shape(inputs["pixel_mean"])[0]
        return {
            "label": label,
            "channel_mean": tf.tile(tf.expand_dims(mean, 0), [rows, 1]),
            "channel_std": tf.tile(tf.expand_dims(std, 0), [rows, 1]),
        }

    return preprocessing_fn


def write_transform(folder: str, label_names, channels: int, summary) -> str:
    """Write transform_fn/ and transformed_metadata/ under the local `folder`; returns their parent.

    `summary` is trainstats' dict. The label vocabulary and the frequencies (exact counts) are
    assets beside the graph, in tf.Transform's vocabulary formats.
    """
    from tensorflow_transform import impl_helper

    output = os.path.join(folder, "analysis")
    specs = raw_feature_spec(channels)
    type_specs = {name: tf.TensorSpec([None, *spec.shape], spec.dtype) for name, spec in specs.items()}
    impl_helper.analyze_in_place(make_preprocessing_fn(label_names, summary), False, specs, type_specs, output)
    assets = os.path.join(output, tft.TFTransformOutput.TRANSFORM_FN_DIR, tf.saved_model.ASSETS_DIRECTORY)
    os.makedirs(assets, exist_ok=True)
    _write_lines(os.path.join(assets, LABEL_VOCABULARY), list(label_names))
    _write_lines(os.path.join(assets, FREQUENCY_VOCABULARY), trainstats.frequency_lines(summary["label_counts"]))
    asset_map = {name: name for name in (LABEL_VOCABULARY, FREQUENCY_VOCABULARY)}  # how TFTransformOutput finds them
    _write_lines(os.path.join(output, tft.TFTransformOutput.TRANSFORMED_METADATA_DIR, "asset_map"), [json.dumps(asset_map)])
    return output


def build(folder: str, label_names, channels: int, summary: dict):
    """(the graph's folder, its statistics for dataset.json): written on local disk, then read back."""
    output = write_transform(folder, label_names, channels, summary)
    return output, read_statistics(output, channels)


def _write_lines(path: str, lines) -> None:
    with open(path + ".partial", "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)
    os.replace(path + ".partial", path)


def read_statistics(transform_dir: str, channels: int) -> dict:
    """What the transform graph computed, for people: pixel mean/std and label frequencies."""
    tft_output = tft.TFTransformOutput(transform_dir)
    row = {
        "label_text": tf.constant([""]),
        "pixel_mean": tf.zeros([1, channels]),
        "pixel_sq_mean": tf.zeros([1, channels]),
    }
    out = tft_output.transform_raw_features(row)
    frequencies = {}
    with tf.io.gfile.GFile(tft_output.vocabulary_file_by_name(FREQUENCY_VOCABULARY)) as f:
        for line in f:
            count, _, label = line.rstrip("\n").partition(" ")
            frequencies[label] = int(count)
    return {
        "pixel_mean": [round(float(v), 4) for v in out["channel_mean"].numpy()[0]],
        "pixel_std": [round(float(v), 4) for v in out["channel_std"].numpy()[0]],
        "label_frequencies": dict(sorted(frequencies.items())),
        "label_vocabulary": [v.decode("utf-8") for v in tft_output.vocabulary_by_name(LABEL_VOCABULARY)],
    }
