"""`beam-etl verify` on a sound dataset and on damaged copies of it."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from beam_etl import verify
from tests.conftest import ROOT


def run_verify(*args):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "beam_etl", "verify", *map(str, args)], capture_output=True, text=True, env=env)


@pytest.fixture
def copy(small_dataset, tmp_path):
    target = tmp_path / "ds"
    shutil.copytree(small_dataset, target)
    return target


def first_shard(data_dir):
    document = json.loads((data_dir / "dataset.json").read_text())
    return data_dir / document["splits"]["train"]["shards"][0]["file"]


def test_sound_dataset_passes(small_dataset):
    proc = run_verify(small_dataset)
    assert proc.returncode == 0 and "OK:" in proc.stdout
    assert verify.verify(str(small_dataset), log=lambda _: None) == []


def test_flipped_byte_is_found(copy):
    shard = first_shard(copy)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    proc = run_verify(copy)
    assert proc.returncode == 1
    assert f"{shard}: sha256" in proc.stderr and "CRC" in proc.stderr


def test_truncated_shard_is_found(copy):
    shard = first_shard(copy)
    shard.write_bytes(shard.read_bytes()[:-100])
    problems = verify.verify(str(copy), log=lambda _: None)
    assert any("bytes, dataset.json says" in p for p in problems) and any("truncated" in p for p in problems)


def test_missing_shard_is_found(copy):
    shard = first_shard(copy)
    shard.unlink()
    assert verify.verify(str(copy), log=lambda _: None) == [f"{shard}: missing"]


def test_count_mismatch_is_found(copy):
    document = json.loads((copy / "dataset.json").read_text())
    document["splits"]["train"]["shards"][0]["examples"] += 1
    (copy / "dataset.json").write_text(json.dumps(document))
    problems = verify.verify(str(copy), log=lambda _: None)
    assert any("records, dataset.json says" in p for p in problems)
    assert any("is not the sum over its shards" in p for p in problems)


def test_not_a_dataset(tmp_path):
    proc = run_verify(tmp_path)
    assert proc.returncode == 2 and "no dataset.json" in proc.stderr and "Traceback" not in proc.stderr
