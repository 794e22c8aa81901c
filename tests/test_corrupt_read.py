"""A damaged shard on read: the trainer names the file, or skips the damaged records with --skip_corrupt."""

import json
import shutil
import subprocess

import pytest

from tests.test_task import MNIST_FLAGS, ROOT, trainer_command, trainer_env

pytest.importorskip("tensorflow")


@pytest.fixture
def damaged(mnist_dataset, tmp_path):
    data = tmp_path / "ds"
    shutil.copytree(mnist_dataset, data)
    document = json.loads((data / "dataset.json").read_text())
    shard = data / document["splits"]["train"]["shards"][1]["file"]
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # one flipped byte, in the middle of a record
    shard.write_bytes(bytes(raw))
    return data, shard, document["splits"]["train"]["shards"][1]["examples"]


def train(data, job, *extra):
    args = ["train", "--data_dir", data, "--job_dir", job, "--epochs", 1, "--batch_size", 64, *MNIST_FLAGS, *extra]
    return subprocess.run(trainer_command(*args), capture_output=True, text=True, env=trainer_env(), cwd=ROOT)


def test_corrupt_shard_stops_training_with_its_name(damaged, tmp_path):
    data, shard, _ = damaged
    proc = train(data, tmp_path / "job")
    assert proc.returncode == 1, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("trainer train: error: corrupt shard(s):") and str(shard) in last and "--skip_corrupt" in last


def test_skip_corrupt_skips_and_reports(damaged, tmp_path):
    data, shard, examples = damaged
    proc = train(data, tmp_path / "job", "--skip_corrupt")
    assert proc.returncode == 0, proc.stderr[-2000:]
    skipped = json.loads((tmp_path / "job" / "metrics.json").read_text())["skipped_records"]
    assert list(skipped) == [str(shard)] and 0 < skipped[str(shard)] < examples
    assert f"trainer: skipping {skipped[str(shard)]} of {examples} records of {shard}: corrupted record" in proc.stdout
