"""The training split's statistics as a combiner's pure parts: no Beam, no TensorFlow.

What tf.Transform's analyzers used to compute over one row per training image (the label
frequencies and the mean of each image's per-channel pixel mean and mean square), summed here
in float64 so that any runner can combine them in parallel with no TensorFlow in its workers.
analyze.write_transform then bakes the result into the transform graph once, at publish.
"""

import math

LABEL_VOCABULARY = "label"
FREQUENCY_VOCABULARY = "label_frequency"


def transform_contract(channels: int) -> dict:
    """The inputs and outputs of the transform graph, as dataset.json records them (no TensorFlow needed)."""
    return {
        "inputs": {
            "label_text": {"dtype": "string", "shape": []},
            "pixel_mean": {"dtype": "float32", "shape": [channels]},
            "pixel_sq_mean": {"dtype": "float32", "shape": [channels]},
        },
        "outputs": {
            "label": {"dtype": "int64", "shape": []},
            "channel_mean": {"dtype": "float32", "shape": [channels]},
            "channel_std": {"dtype": "float32", "shape": [channels]},
        },
        "vocabulary": LABEL_VOCABULARY,
        "frequency_vocabulary": FREQUENCY_VOCABULARY,
        "scale": "pixel values 0..255",
    }


def empty(channels: int) -> dict:
    """The accumulator: images, per-channel sums of pixel_mean and pixel_sq_mean, label counts."""
    return {"examples": 0, "sum": [0.0] * channels, "sq_sum": [0.0] * channels, "labels": {}}


def add(acc: dict, label_text: str, pixel_mean, pixel_sq_mean) -> dict:
    """Count one training image into `acc` (in place; returned for the combiner)."""
    acc["examples"] += 1
    for i, (mean, sq_mean) in enumerate(zip(pixel_mean, pixel_sq_mean)):
        acc["sum"][i] += mean
        acc["sq_sum"][i] += sq_mean
    acc["labels"][label_text] = acc["labels"].get(label_text, 0) + 1
    return acc


def merge(accs, channels: int) -> dict:
    """Several accumulators as one."""
    out = empty(channels)
    for acc in accs:
        out["examples"] += acc["examples"]
        out["sum"] = [a + b for a, b in zip(out["sum"], acc["sum"])]
        out["sq_sum"] = [a + b for a, b in zip(out["sq_sum"], acc["sq_sum"])]
        for label, count in acc["labels"].items():
            out["labels"][label] = out["labels"].get(label, 0) + count
    return out


def finish(acc: dict) -> dict:
    """The summary: examples, pixel_mean and pixel_sq_mean per channel (0 with no image), label counts."""
    n = acc["examples"]
    return {
        "examples": n,
        "pixel_mean": [s / n if n else 0.0 for s in acc["sum"]],
        "pixel_sq_mean": [s / n if n else 0.0 for s in acc["sq_sum"]],
        "label_counts": dict(sorted(acc["labels"].items())),
    }


def pixel_std(summary: dict) -> list:
    """Per-channel std from the means, floored as the transform graph floors it."""
    return [math.sqrt(max(sq - m * m, 1e-6)) for m, sq in zip(summary["pixel_mean"], summary["pixel_sq_mean"])]


def frequency_lines(label_counts: dict) -> list:
    """tf.Transform's frequency-vocabulary file: 'COUNT LABEL', largest count first, ties by label descending."""
    ranked = sorted(((count, label.encode("utf-8")) for label, count in label_counts.items()), reverse=True)
    return [f"{count} {label.decode('utf-8')}" for count, label in ranked]
