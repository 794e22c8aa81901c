"""Killed conversions: never a half-done dataset that looks complete, and a re-run gives the same records."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from beam_etl import verify
from tests.conftest import ROOT, run_convert
from tests.test_convert_e2e import read_records

pytest.importorskip("tensorflow")

MNIST_FLAGS = ["--channels", "1", "--image_format", "png", "--validation_fraction", "0.1", "--num_shards", "train=4,validation=2"]


def staging(out):
    return [p for p in out.iterdir() if p.name.startswith(".staging-")] if out.exists() else []


# Points to kill at, each a condition on the output folder seen while the job runs.
POINTS = {
    "listing": lambda out: bool(staging(out)),
    "writing_shards": lambda out: any((s / "shards").exists() and any((s / "shards").iterdir()) for s in staging(out)),
    "publishing": lambda out: out.exists() and any(p.name.endswith(".tfrecord") for p in out.iterdir()),
}


# The publish is a handful of renames, done in milliseconds: on a loaded machine the kill
# could land after dataset.json. Each move is followed by a pause in the child, so that a
# kill sent on seeing the first published shard lands mid-publish.
SLOW_PUBLISH = (
    "import time; from beam_etl import cli, metadata; move = metadata._move; "
    "metadata._move = lambda a, b: (move(a, b), time.sleep(0.5)); cli.run()"
)


def convert_and_kill(folder, out, condition, timeout=300):
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    args = ["convert", "--input", str(folder), "--output", str(out), *MNIST_FLAGS]
    cmd = [sys.executable, "-c", SLOW_PUBLISH, *args]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + timeout
    try:
        while proc.poll() is None and time.time() < deadline:
            if condition(out):
                os.killpg(proc.pid, signal.SIGKILL)
                return "killed"
            time.sleep(0.002)
        return "finished"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def records_by_split(out):
    document = json.loads((out / "dataset.json").read_text())
    return {split: sorted((r["key"], r["sha256"]) for r in read_records(out, document, split)) for split in document["splits"]}


@pytest.mark.parametrize("point", sorted(POINTS))
def test_killed_convert_is_never_published_half_done(point, mnist_folder, mnist_dataset, tmp_path):
    out = tmp_path / "ds"
    outcome = convert_and_kill(mnist_folder, out, POINTS[point])
    if outcome == "killed":
        # Whatever is left, it does not look complete.
        assert not (out / "dataset.json").exists()
    else:  # the job finished before the point was seen: then it must be complete and sound
        assert verify.verify(str(out), log=lambda _: None) == []
    run_convert("--input", mnist_folder, "--output", out, *MNIST_FLAGS)  # no --overwrite needed after a kill
    assert not staging(out)  # the killed run's staging folder went with the publish
    assert verify.verify(str(out), decode=False, log=lambda _: None) == []
    assert records_by_split(out) == records_by_split(mnist_dataset)
