"""DALI index files: tfrecord2idx's text format, checked with a reader written from it and with DALI itself."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from beam_etl import index, tfrecord
from tests.conftest import ROOT, run_convert
from tests.test_convert_e2e import make_folder


def beam_etl(*args):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "beam_etl", *map(str, args)], capture_output=True, text=True, env=env, cwd=ROOT)


def read_with_index(shard, idx):
    """What DALI's reader does with an index (its documented format): seek to each offset, read `size` bytes, one whole record."""
    entries = [tuple(map(int, line.split(" "))) for line in idx.read_text().splitlines()]
    assert idx.read_text().endswith("\n") and all(len(line.split(" ")) == 2 for line in idx.read_text().splitlines())
    records = []
    with open(shard, "rb") as f:
        for offset, size in entries:
            f.seek(offset)
            framed = f.read(size)
            assert len(framed) == size
            (length,) = tfrecord._HEADER.unpack_from(framed)
            assert size == length + 16  # 8 length + 4 CRC + data + 4 CRC: the whole framed record
            f.seek(offset)
            assert tfrecord.read_framed(f, str(shard), offset) == framed  # CRCs check out: a record starts exactly here
            records.append(framed[12:-4])
    return entries, records


def check_indexed(data_dir):
    document = json.loads((data_dir / "dataset.json").read_text())
    for split in document["splits"].values():
        assert split["index"] is True
        for shard in split["shards"]:
            path = data_dir / shard["file"]
            entries, records = read_with_index(path, data_dir / (shard["file"] + ".idx"))
            with open(path, "rb") as f:
                assert records == [record for _, _, record in tfrecord.iter_framed(f, str(path))]
            assert shard["index"] is True and len(entries) == shard["examples"]
            assert entries[-1][0] + entries[-1][1] == os.path.getsize(path)
    return document


@pytest.fixture(scope="module")
def indexed(mnist_dataset, tmp_path_factory):
    """A copy of the MNIST dataset, indexed by `beam-etl index`."""
    copy = tmp_path_factory.mktemp("indexed") / "ds"
    shutil.copytree(mnist_dataset, copy)
    proc = beam_etl("index", copy)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"wrote 6 index files in {copy}"
    return copy


def test_index_command_writes_the_dali_format(indexed):
    check_indexed(indexed)
    first = (indexed / "train-00000-of-00004.tfrecord.idx").read_text().splitlines()[0]
    assert first.startswith("0 ")


def test_matches_dali_and_its_tfrecord2idx(indexed, tmp_path):
    """Run only where NVIDIA DALI is installed (pip install nvidia-dali-cuda120; a CPU pipeline needs no GPU)."""
    pytest.importorskip("nvidia.dali")
    import numpy as np
    import nvidia.dali.fn as fn
    import nvidia.dali.tfrecord as tfrec
    from nvidia.dali import pipeline_def

    from beam_etl.schema import decode_example

    document = json.loads((indexed / "dataset.json").read_text())
    files = [str(indexed / s["file"]) for s in document["splits"]["validation"]["shards"]]
    import nvidia.dali

    site = os.path.dirname(os.path.dirname(os.path.dirname(nvidia.dali.__file__)))  # pip --target puts scripts in its bin/
    script = next((s for s in (shutil.which("tfrecord2idx"), os.path.join(site, "bin", "tfrecord2idx")) if s and os.path.exists(s)), None)
    if script:  # DALI's own indexer writes the same bytes
        for path in files:
            subprocess.run([sys.executable, script, path, str(tmp_path / "dali.idx")], check=True, capture_output=True)
            assert (tmp_path / "dali.idx").read_bytes() == open(path + ".idx", "rb").read()

    expected = []
    for path in files:
        with open(path, "rb") as f:
            expected += [decode_example(record) for _, _, record in tfrecord.iter_framed(f, path)]
    total = document["splits"]["validation"]["examples"]

    @pipeline_def(batch_size=total, num_threads=1, device_id=None)
    def read():
        r = fn.readers.tfrecord(
            path=files,
            index_path=[f + index.SUFFIX for f in files],
            features={"sha256": tfrec.FixedLenFeature((), tfrec.string, ""), "label": tfrec.FixedLenFeature([1], tfrec.int64, -1)},
            random_shuffle=False,
        )
        return r["sha256"], r["label"]

    pipe = read()
    pipe.build()
    sha, label = pipe.run()
    got = [(bytes(np.array(sha.at(i))), int(np.array(label.at(i))[0])) for i in range(total)]
    assert got == [(e["sha256"][0], e["label"][0]) for e in expected]


def test_convert_write_index_and_overwrite_without(tmp_path):
    src = tmp_path / "src"
    make_folder(src)
    out = tmp_path / "ds"
    run_convert("--input", src, "--output", out, "--validation_fraction", "0.25", "--num_shards", "train=2,validation=1", "--write_index", "--progress", "none")
    document = check_indexed(out)
    assert document["options"]["write_index"] is True
    assert sorted(p.name for p in out.glob("*.idx")) == ["train-00000-of-00002.tfrecord.idx", "train-00001-of-00002.tfrecord.idx", "validation-00000-of-00001.tfrecord.idx"]
    assert not [p for p in out.rglob("*.tmp")]
    run_convert("--input", src, "--output", out, "--num_shards", "1", "--overwrite", "--progress", "none")
    assert not list(out.glob("*.idx"))  # an old index would point into a shard it no longer describes
    assert "index" not in json.loads((out / "dataset.json").read_text())["splits"]["train"]


def test_gzip_cannot_be_indexed(tmp_path):
    src = tmp_path / "src"
    make_folder(src, seeds=range(3))
    proc = run_convert("--input", src, "--output", tmp_path / "ds", "--compression", "gzip", "--write_index", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "--write_index needs --compression none" in proc.stderr
    gz = tmp_path / "x.tfrecord.gz"
    gz.write_bytes(b"")
    with pytest.raises(index.NotIndexable, match="--compression none"):
        index.write_index(str(gz))


def test_index_command_needs_a_dataset(tmp_path):
    proc = beam_etl("index", tmp_path)
    assert proc.returncode == 2 and "no dataset.json" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_index_command_refuses_a_gzip_dataset(mnist_dataset, tmp_path):
    copy = tmp_path / "ds"
    copy.mkdir()
    document = json.loads((mnist_dataset / "dataset.json").read_text())
    document["compression"], document["tfrecord_compression"] = "gzip", "GZIP"
    (copy / "dataset.json").write_text(json.dumps(document))
    proc = beam_etl("index", copy)
    assert proc.returncode == 2 and "gzip-compressed" in proc.stderr and "Traceback" not in proc.stderr


def test_a_shard_that_does_not_match_dataset_json_fails(indexed, tmp_path):
    copy = tmp_path / "ds"
    shutil.copytree(indexed, copy)
    shard = copy / "validation-00000-of-00002.tfrecord"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])  # cut mid-record
    proc = beam_etl("index", copy)
    assert proc.returncode == 1 and "validation-00000-of-00002.tfrecord: truncated record" in proc.stderr
