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
        analysis, statistics = transform_helper.hand_over(folder, pid, ["a", "b"], 1, SUMMARY, timeout_s=300)
        assert analysis == os.path.join(folder, "analysis")
        assert statistics["label_frequencies"] == {"a": 2, "b": 1} and statistics["pixel_mean"] == [1.0]
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


def test_the_launcher_never_imports_tensorflow_on_the_direct_runner(tmp_path):
    """TensorFlow is the helper's: a small job converts, publishes the graph and reports in a launcher without it."""
    import subprocess
    import sys

    from tests import corpus
    from tests.conftest import ROOT

    images = tmp_path / "in"
    for label in ("cat", "dog"):
        (images / label).mkdir(parents=True)
        for i in range(3):
            (images / label / f"{i}.jpg").write_bytes(corpus.jpeg(seed=i))
    out = tmp_path / "out"
    code = (
        "import sys; from beam_etl import cli\n"
        f"code = cli.main(['convert', '--input', {str(images)!r}, '--output', {str(out)!r}, '--num_shards', '1', '--progress', 'none'])\n"
        "assert code == 0, code\n"
        "assert 'tensorflow' not in sys.modules, 'the launcher imported TensorFlow'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "transform_fn" / "saved_model.pb").exists() and (out / "dataset.json").exists()
