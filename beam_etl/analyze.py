"""tf.Transform analysis of the training split: label vocabulary and per-channel pixel statistics."""

import tensorflow as tf
import tensorflow_transform as tft

LABEL_VOCABULARY = "label"
FREQUENCY_VOCABULARY = "label_frequency"


def raw_feature_spec(channels: int) -> dict:
    """What AnalyzeStatistics feeds tf.Transform, one row per training image."""
    return {
        "label_text": tf.io.FixedLenFeature([], tf.string),
        "pixel_mean": tf.io.FixedLenFeature([channels], tf.float32),
        "pixel_sq_mean": tf.io.FixedLenFeature([channels], tf.float32),
    }


def transform_contract(channels: int) -> dict:
    """The inputs and outputs of the transform graph, as written into dataset.json."""
    return {
        "inputs": {name: {"dtype": spec.dtype.name, "shape": list(spec.shape)} for name, spec in raw_feature_spec(channels).items()},
        "outputs": {
            "label": {"dtype": "int64", "shape": []},
            "channel_mean": {"dtype": "float32", "shape": [channels]},
            "channel_std": {"dtype": "float32", "shape": [channels]},
        },
        "vocabulary": LABEL_VOCABULARY,
        "frequency_vocabulary": FREQUENCY_VOCABULARY,
        "scale": "pixel values 0..255",
    }


def make_preprocessing_fn(label_names):
    """The analysis: label ids in sorted-name order, and the pixel mean and std per channel."""
    label_names = list(label_names)

    def preprocessing_fn(inputs):
        # Reserved tokens keep their order at the head of the vocabulary, so vocabulary ids
        # equal positions in the sorted names: the same ids as the records. (A tensor of
        # names from another analyzer is not evaluated in time in TFT 1.21: it reads as a
        # placeholder, so the names come from the launcher.)
        vocabulary = tft.vocabulary(inputs["label_text"], vocab_filename=LABEL_VOCABULARY, reserved_tokens=label_names)
        tft.vocabulary(inputs["label_text"], vocab_filename=FREQUENCY_VOCABULARY, store_frequency=True)
        mean = tft.mean(inputs["pixel_mean"], reduce_instance_dims=False)
        sq_mean = tft.mean(inputs["pixel_sq_mean"], reduce_instance_dims=False)
        std = tf.sqrt(tf.maximum(sq_mean - tf.square(mean), 1e-6))
        rows = tf.shape(inputs["pixel_mean"])[0]
        return {
            "label": tft.apply_vocabulary(inputs["label_text"], vocabulary),
            "channel_mean": tf.tile(tf.expand_dims(mean, 0), [rows, 1]),
            "channel_std": tf.tile(tf.expand_dims(std, 0), [rows, 1]),
        }

    return preprocessing_fn


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
