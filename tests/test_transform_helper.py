"""The helper that writes the transform graph beside a DirectRunner job: real processes."""

import os
import signal

import pytest

from beam_etl import transform_helper

pytest.importorskip("tensorflow_transform")

SUMMARY = {"examples": 3, "pixel_mean": [1.0], "pixel_sq_mean": [2.0], "label_counts": {"a": 2, "b": 1}}


def test_the_helper_writes_the_graph_it_is_handed_the_summary_for():
    folder, pid = transform_helper.start()
    try:
        analysis = transform_helper.hand_over(folder, pid, ["a", "b"], 1, SUMMARY, timeout_s=300)
        assert analysis == os.path.join(folder, "analysis")
        assert os.path.exists(os.path.join(analysis, "transform_fn", "saved_model.pb"))
        with open(os.path.join(analysis, "transform_fn", "assets", "label_frequency")) as f:
            assert f.read().splitlines() == ["2 a", "1 b"]
    finally:
        transform_helper.stop_all()
    assert not os.path.exists(folder)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped: not even a zombie is left


def test_a_dead_helper_is_noticed_and_the_caller_writes_the_graph_itself():
    folder, pid = transform_helper.start()
    try:
        os.kill(pid, signal.SIGKILL)
        assert transform_helper.hand_over(folder, pid, ["a", "b"], 1, SUMMARY, timeout_s=300) is None  # at once, not after the timeout
    finally:
        transform_helper.stop_all()
