"""The whole convert job on the DirectRunner, as a user runs it, read back with tf.data."""

import hashlib
import io
import json
import re

import numpy as np
import pytest
from PIL import Image

from tests import corpus
from tests.corpus import make_folder
from tests.conftest import run_convert

tf = pytest.importorskip("tensorflow")
SHARD = re.compile(r"^(train|validation|test)-(\d{5})-of-(\d{5})\.tfrecord(\.gz)?$")


BROKEN = {
    "ant/truncated.jpg": corpus.jpeg(200, 150, seed=99)[:2000],
    "bee/empty.jpg": b"",
    "cow/notes.jpg": b"meeting notes, not a photo",
    "stray.jpg": corpus.jpeg(seed=5),
}


def read_records(data_dir, document, split):
    features = {f["name"]: tf.io.FixedLenFeature([], tf.string if f["dtype"] == "string" else tf.int64) for f in document["features"].values()}
    names = {role: f["name"] for role, f in document["features"].items()}
    files = [str(data_dir / s["file"]) for s in document["splits"][split]["shards"]]
    for raw in tf.data.TFRecordDataset(files, compression_type=document["tfrecord_compression"]):
        parsed = tf.io.parse_single_example(raw, features)
        yield {role: parsed[name].numpy() for role, name in names.items()}


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("src") / "photos"
    files = make_folder(root, extra=BROKEN)
    out = tmp_path_factory.mktemp("out") / "ds"
    proc = run_convert("--input", root, "--output", out, "--validation_fraction", "0.25", "--num_shards", "train=2,validation=1", "--max_reject_fraction", "0.5")
    return root, files, out, proc


def test_summary_is_printed(converted):
    _, _, _, proc = converted
    assert "train" in proc.stdout and "images/s" in proc.stdout
    assert "rejected: 4 (corrupt" in proc.stdout or "rejected: 4 (" in proc.stdout


def test_every_input_is_written_or_rejected(converted):
    root, files, out, _ = converted
    document = json.loads((out / "dataset.json").read_text())
    written = {r["key"].decode(): split for split in document["splits"] for r in read_records(out, document, split)}
    rejected = [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]
    assert document["inputs"] == len(files) == len(written) + len(rejected)
    assert set(written) | {r["key"] for r in rejected} == set(files)
    assert {r["key"]: r["reason"] for r in rejected} == {"ant/truncated.jpg": "truncated", "bee/empty.jpg": "empty", "cow/notes.jpg": "not_an_image", "stray.jpg": "no_label"} or all(r["message"] for r in rejected)
    assert document["rejected"]["total"] == 4 and sum(document["rejected"]["by_reason"].values()) == 4
    assert all(r["path"].startswith(str(root)) and r["message"] for r in rejected)


def test_records_hold_the_images(converted):
    root, files, out, _ = converted
    document = json.loads((out / "dataset.json").read_text())
    assert document["label_names"] == ["ant", "bee", "cow"]
    for split in document["splits"]:
        for record in read_records(out, document, split):
            key = record["key"].decode()
            source = files[key]
            assert record["label"] == document["label_names"].index(key.split("/")[0])
            assert record["label_text"].decode() == key.split("/")[0]
            assert record["sha256"].decode() == hashlib.sha256(record["image"]).hexdigest()
            pixels = tf.io.decode_image(record["image"]).numpy()
            assert pixels.shape == (record["height"], record["width"], record["channels"])
            if key.endswith(".jpg"):
                assert record["image"] == source  # a plain RGB JPEG passes through untouched
            else:
                expected = np.asarray(Image.open(io.BytesIO(source)).convert("RGB")).astype(int)
                # Re-encoded as JPEG at quality 95: noise and chroma detail go, the picture stays.
                assert np.abs(pixels.astype(int) - expected).mean() < 16
                assert np.abs(pixels.mean(axis=(0, 1)) - expected.mean(axis=(0, 1))).max() < 3


def test_shards_names_counts_and_checksums(converted):
    _, _, out, _ = converted
    document = json.loads((out / "dataset.json").read_text())
    on_disk = sorted(p.name for p in out.iterdir() if SHARD.match(p.name))
    listed = sorted(s["file"] for split in document["splits"].values() for s in split["shards"])
    assert on_disk == listed == ["train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord", "validation-00000-of-00001.tfrecord"]
    for split in document["splits"].values():
        assert split["examples"] == sum(s["examples"] for s in split["shards"]) == sum(split["label_counts"].values())
        for shard in split["shards"]:
            data = (out / shard["file"]).read_bytes()
            assert shard["bytes"] == len(data) and shard["sha256"] == hashlib.sha256(data).hexdigest()
            assert shard["examples"] == sum(1 for _ in tf.data.TFRecordDataset(str(out / shard["file"])))
    assert not [p for p in out.iterdir() if p.name.startswith(".staging")]


def test_transform_output_loads(converted):
    import tensorflow_transform as tft

    _, _, out, _ = converted
    document = json.loads((out / "dataset.json").read_text())
    tft_out = tft.TFTransformOutput(str(out))
    assert [v.decode() for v in tft_out.vocabulary_by_name("label")] == document["label_names"]
    result = tft_out.transform_raw_features({"label_text": tf.constant(["cow", "ant"]), "pixel_mean": tf.zeros([2, 3]), "pixel_sq_mean": tf.zeros([2, 3])})
    assert result["label"].numpy().tolist() == [2, 0]
    mean = result["channel_mean"].numpy()[0]
    assert mean.shape == (3,) and 20 < mean.min() and mean.max() < 240 and (result["channel_std"].numpy() > 1).all()
    assert document["statistics"]["pixel_mean"] == pytest.approx(mean.tolist(), abs=1e-3)
    assert sum(document["statistics"]["label_frequencies"].values()) == document["splits"]["train"]["examples"]


def test_rerun_with_new_files_keeps_splits(converted, tmp_path):
    root, files, out, _ = converted
    first = json.loads((out / "dataset.json").read_text())
    before = {r["key"].decode(): split for split in first["splits"] for r in read_records(out, first, split)}
    refused = run_convert("--input", root, "--output", out, "--validation_fraction", "0.25", check=False)
    assert refused.returncode == 2 and "already holds a complete dataset" in refused.stderr and "Traceback" not in refused.stderr
    copy = tmp_path / "more"
    make_folder(copy, seeds=range(24))  # the same 12 images plus 12 new ones
    second_out = tmp_path / "ds2"
    run_convert("--input", copy, "--output", second_out, "--validation_fraction", "0.25")
    second = json.loads((second_out / "dataset.json").read_text())
    after = {r["key"].decode(): split for split in second["splits"] for r in read_records(second_out, second, split)}
    assert len(after) == 24
    assert all(after[key] == split for key, split in before.items())


def test_gzip_and_imagenet_schema(tmp_path):
    root = tmp_path / "src"
    make_folder(root)
    out = tmp_path / "ds"
    run_convert("--input", root, "--output", out, "--compression", "gzip", "--schema", "imagenet", "--channels", "1", "--image_format", "png")
    document = json.loads((out / "dataset.json").read_text())
    assert document["tfrecord_compression"] == "GZIP" and document["features"]["image"]["name"] == "image/encoded"
    assert all(s["file"].endswith(".tfrecord.gz") for s in document["splits"]["train"]["shards"])
    records = list(read_records(out, document, "train"))
    assert len(records) == 12 and all(r["channels"] == 1 and r["format"] == b"png" for r in records)
    raw = next(iter(tf.data.TFRecordDataset(str(out / document["splits"]["train"]["shards"][0]["file"]), compression_type="GZIP")))
    assert "image/class/label" in tf.train.Example.FromString(raw.numpy()).features.feature


def test_too_many_rejects_fails_clearly(tmp_path):
    root = tmp_path / "src"
    make_folder(root, seeds=range(3), extra=BROKEN)
    out = tmp_path / "ds"
    proc = run_convert("--input", root, "--output", out, check=False)
    assert proc.returncode == 1
    assert "4 of 7 inputs (57.1%) were rejected, over --max_reject_fraction 0.05" in proc.stderr
    assert not (out / "dataset.json").exists() and (out / "rejected.jsonl").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--input", "/nonexistent/folder"], "--input /nonexistent/folder: no such folder"),
        (["--input", "{src}", "--num_shards", "train=x"], "--num_shards: bad part 'train=x'"),
        (["--input", "{src}", "--validation_fraction", "1.5"], "--validation_fraction must be in [0, 1]"),
        (["--input", "{src}/m.csv"], "{src}/m.csv:2: expected path,label[,split]"),
        (["--input", "{src}", "--labels", "ant,bee"], None),
    ],
)
def test_bad_arguments_exit_2_with_one_line(tmp_path, args, message):
    src = tmp_path / "src"
    make_folder(src, seeds=range(3))
    (src / "m.csv").write_text("ant/img_1.jpg,ant\nbroken row,with,four,cells\n")
    proc = run_convert(*[a.format(src=src) for a in args], "--output", tmp_path / "out", check=False)
    if message is None:  # --labels without cow: the cow image is rejected as unknown_label, over 5%
        assert proc.returncode == 1 and "were rejected" in proc.stderr
        assert "unknown_label" in (tmp_path / "out" / "rejected.jsonl").read_text()
        return
    assert proc.returncode == 2, proc.stderr
    assert message.format(src=src) in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_output_that_cannot_be_written(tmp_path):
    src = tmp_path / "src"
    make_folder(src, seeds=range(3))
    blocker = tmp_path / "file"
    blocker.write_text("x")
    proc = run_convert("--input", src, "--output", blocker / "sub", check=False)
    assert proc.returncode == 2 and f"--output {blocker / 'sub'}: cannot create it" in proc.stderr


def test_tfrecordio_writer_gives_the_same_records(converted, tmp_path):
    root, _, out, _ = converted
    other = tmp_path / "ds"
    run_convert("--input", root, "--output", other, "--validation_fraction", "0.25", "--num_shards", "train=2,validation=1", "--max_reject_fraction", "0.5", "--writer", "tfrecordio", "--write_index")
    first, second = (json.loads((d / "dataset.json").read_text()) for d in (out, other))
    for split in first["splits"]:
        assert sorted(r["key"] for r in read_records(out, first, split)) == sorted(r["key"] for r in read_records(other, second, split))
        assert [s["file"] for s in first["splits"][split]["shards"]] == [s["file"] for s in second["splits"][split]["shards"]]
    assert first["rejected"] == second["rejected"]
    for split in second["splits"].values():
        for shard in split["shards"]:
            lines = (other / (shard["file"] + ".idx")).read_text().splitlines()
            assert len(lines) == shard["examples"] and shard["index"] is True


def test_tfrecordio_writer_needs_a_shard_count(tmp_path):
    src = tmp_path / "src"
    make_folder(src, seeds=range(3))
    proc = run_convert("--input", src, "--output", tmp_path / "out", "--writer", "tfrecordio", check=False)
    assert proc.returncode == 2 and "WriteToTFRecord fixes the shard count" in proc.stderr


def test_tfrecordio_writer_is_refused_where_beam_loses_records(tmp_path):
    src = tmp_path / "src"
    make_folder(src, seeds=range(3))
    proc = run_convert("--input", src, "--output", tmp_path / "out", "--writer", "tfrecordio", "--num_shards", "2", "--direct_running_mode", "multi_threading", check=False)
    assert proc.returncode == 2 and "loses records on the DirectRunner's multi_threading mode" in proc.stderr
    assert not (tmp_path / "out" / "dataset.json").exists()


def test_rerun_of_unchanged_source_is_a_no_op(converted):
    root, _, out, _ = converted
    before = (out / "dataset.json").read_bytes()
    args = ["--input", root, "--output", out, "--validation_fraction", "0.25", "--num_shards", "train=2,validation=1", "--max_reject_fraction", "0.5"]
    proc = run_convert(*args)
    assert "is up to date" in proc.stdout and (out / "dataset.json").read_bytes() == before
    (root / "ant" / "img_3.jpg").write_bytes((root / "ant" / "img_3.jpg").read_bytes() + b"\0")  # the source changed
    proc = run_convert(*args, check=False)
    assert proc.returncode == 2 and "other inputs or options; pass --overwrite" in proc.stderr
