"""The training split's statistics: the pure combiner parts, SummarizeTraining, and the graph built from them."""

import os
import random

import numpy as np
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from beam_etl import trainstats
from beam_etl.records import Facts
from beam_etl.transforms import SummarizeTraining


def _facts(split, label, mean, sq_mean):
    return Facts(split, f"{label}/{random.random()}", 0, label, 1, 1, 1, tuple(mean), tuple(sq_mean), "", True, "", "")


def _rows(n, seed=0):
    rng = np.random.default_rng(seed)
    labels = rng.choice(["ant", "bee", "cow", "émeu"], size=n)
    means = rng.uniform(0, 255, size=(n, 3))
    return [(str(label), tuple(m), tuple(m * m + rng.uniform(0, 400, 3))) for label, m in zip(labels, means)]


def test_merged_parts_equal_one_pass_and_numpy():
    rows = _rows(1000)
    one = trainstats.empty(3)
    for row in rows:
        trainstats.add(one, *row)
    parts = [trainstats.empty(3) for _ in range(7)]
    for i, row in enumerate(rows):
        trainstats.add(parts[i % 7], *row)
    merged = trainstats.finish(trainstats.merge(parts, 3))
    single = trainstats.finish(one)
    assert merged["label_counts"] == single["label_counts"] == {k: sum(r[0] == k for r in rows) for k in {r[0] for r in rows}}
    np.testing.assert_allclose(merged["pixel_mean"], np.mean([r[1] for r in rows], axis=0), rtol=1e-12)
    np.testing.assert_allclose(merged["pixel_sq_mean"], single["pixel_sq_mean"], rtol=1e-12)
    std = np.sqrt(np.mean([r[2] for r in rows], axis=0) - np.square(np.mean([r[1] for r in rows], axis=0)))
    np.testing.assert_allclose(trainstats.pixel_std(merged), std, rtol=1e-9)


def test_no_training_image_gives_zeros_not_a_division_error():
    summary = trainstats.finish(trainstats.merge([trainstats.empty(1)], 1))
    assert summary == {"examples": 0, "pixel_mean": [0.0], "pixel_sq_mean": [0.0], "label_counts": {}}
    assert trainstats.pixel_std(summary) == [pytest.approx(1e-3)]


def test_frequency_lines_follow_tf_transform_order():
    # Largest count first; equal counts by label, descending, as tf.Transform sorts (count, token) pairs.
    assert trainstats.frequency_lines({"ant": 2, "bee": 5, "cow": 2, "dog": 1}) == ["5 bee", "2 cow", "2 ant", "1 dog"]


def test_summarize_training_counts_only_the_training_split():
    facts = [_facts("train", "ant", (10, 20, 30), (100, 400, 900)), _facts("train", "bee", (30, 40, 50), (900, 1600, 2500)),
             _facts("validation", "cow", (255, 255, 255), (65025,) * 3)]
    expected = {"examples": 2, "pixel_mean": [20.0, 30.0, 40.0], "pixel_sq_mean": [500.0, 1000.0, 1700.0],
                "label_counts": {"ant": 1, "bee": 1}}
    with TestPipeline() as p:
        summary = p | "Facts" >> __import__("apache_beam").Create(facts) | "Summarize" >> SummarizeTraining(3)
        assert_that(summary, equal_to([expected]))


def test_the_written_graph_gives_the_summary_and_the_label_ids(tmp_path):
    tf = pytest.importorskip("tensorflow")
    tft = pytest.importorskip("tensorflow_transform")
    from beam_etl import analyze

    summary = {"examples": 9, "pixel_mean": [100.0, 50.5, 3.25], "pixel_sq_mean": [10100.0, 2550.5, 10.5625],
               "label_counts": {"ant": 4, "bee": 5}}
    output = analyze.write_transform(str(tmp_path), ["ant", "bee", "cow"], 3, summary)
    transform = tft.TFTransformOutput(output)
    out = transform.transform_raw_features({
        "label_text": tf.constant(["cow", "ant", "bee", "yak"]),
        "pixel_mean": tf.zeros([4, 3]),
        "pixel_sq_mean": tf.zeros([4, 3]),
    })
    assert out["label"].numpy().tolist() == [2, 0, 1, -1]  # sorted-name ids; -1 for a label not in the vocabulary
    np.testing.assert_allclose(out["channel_mean"].numpy(), [summary["pixel_mean"]] * 4)
    np.testing.assert_allclose(out["channel_std"].numpy()[0], [10.0, 0.5, 1e-3], rtol=1e-5)  # floored where sq = mean²
    assert [v.decode() for v in transform.vocabulary_by_name("label")] == ["ant", "bee", "cow"]
    with open(transform.vocabulary_file_by_name("label_frequency")) as f:
        assert f.read().splitlines() == ["5 bee", "4 ant"]
    assert sorted(transform.transformed_feature_spec()) == ["channel_mean", "channel_std", "label"]
    assert analyze.read_statistics(output, 3)["label_frequencies"] == {"ant": 4, "bee": 5}
    assert not [n for n in os.listdir(tmp_path) if n != "analysis"]  # no temp files left beside it
