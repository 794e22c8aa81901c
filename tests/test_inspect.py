"""`beam-etl inspect`: the report, its JSON and the contact sheet, on the real MNIST dataset."""

import gzip
import json
import shutil

import numpy as np
import pytest
from PIL import Image

from beam_etl import inspect, tfrecord
from tests.test_index import beam_etl


def records_of(path):
    with open(path, "rb") as f:
        return [record for _, _, record in tfrecord.iter_framed(f, str(path))]


@pytest.fixture(scope="module")
def report_json(mnist_dataset):
    proc = beam_etl("inspect", mnist_dataset, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_json_report_matches_dataset_json(mnist_dataset, report_json):
    document = json.loads((mnist_dataset / "dataset.json").read_text())
    assert list(report_json["splits"]) == ["train", "validation"]
    for name, split in document["splits"].items():
        got = report_json["splits"][name]
        assert got["examples"] == got["records_read"] == split["examples"]
        assert got["shards"] == len(split["shards"]) and got["label_counts"] == split["label_counts"]
        sizes = sorted(s["bytes"] for s in split["shards"])
        assert got["shard_bytes"]["min"] == sizes[0] and got["shard_bytes"]["max"] == sizes[-1]
    assert report_json["image_sizes"]["most_common"] == [{"height": 28, "width": 28, "records": 5000}]
    assert report_json["rejected"] == {"total": 0, "by_reason": {}}
    assert report_json["duplicates"]["images"] == 0 and report_json["leakage"]["images"] == 0
    assert report_json["duplicates"]["recorded"] == document.get("duplicates")  # what the conversion wrote, where it did


def test_text_report(mnist_dataset, report_json):
    proc = beam_etl("inspect", mnist_dataset)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    train = report_json["splits"]["train"]
    assert any(line.split()[:3] == ["train", str(train["examples"]), "4"] for line in lines)
    histogram = lines[lines.index(f"classes in train ({train['examples']} records)") + 1 :][:10]
    assert [line.split()[:2] for line in histogram] == [[str(d), str(train["label_counts"][str(d)])] for d in range(10)]
    biggest = max(train["label_counts"].values())
    assert all(line.count("#") == round(40 * int(line.split()[1]) / biggest) for line in histogram)
    assert "  28x28 (h x w)     5000 100.0%" in lines and "rejected: 0 (none)" in lines
    assert any(line.startswith("split leakage: 0 images") for line in lines)


def test_duplicates_and_leakage_are_found(mnist_dataset, tmp_path):
    copy = tmp_path / "ds"
    shutil.copytree(mnist_dataset, copy)
    document = json.loads((copy / "dataset.json").read_text())
    train_shard = copy / document["splits"]["train"]["shards"][0]["file"]
    with open(train_shard, "rb") as f:
        _, framed, record = next(tfrecord.iter_framed(f))
    with open(copy / document["splits"]["validation"]["shards"][0]["file"], "ab") as f:
        f.write(framed)  # a training image also in validation
    with open(copy / document["splits"]["train"]["shards"][1]["file"], "ab") as f:
        f.write(framed)  # and twice in train
    proc = beam_etl("inspect", copy, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["leakage"]["images"] == 1 and report["leakage"]["by_pair"] == {"train/validation": 1}
    assert report["duplicates"]["images"] == 1 and report["duplicates"]["extra_records"] == 2
    assert report["splits"]["validation"]["records_read"] == document["splits"]["validation"]["examples"] + 1
    text = beam_etl("inspect", copy).stdout
    assert f"WARNING: the shards hold {report['splits']['validation']['records_read']} records, dataset.json says" in text
    assert "split leakage: 1 images in more than one split (train/validation 1)" in text


def test_reads_gzip_shards(mnist_dataset, tmp_path):
    copy = tmp_path / "ds"
    copy.mkdir()
    document = json.loads((mnist_dataset / "dataset.json").read_text())
    for split in document["splits"].values():
        for shard in split["shards"]:
            (copy / (shard["file"] + ".gz")).write_bytes(gzip.compress((mnist_dataset / shard["file"]).read_bytes()))
            shard["file"] += ".gz"
    document["compression"], document["tfrecord_compression"] = "gzip", "GZIP"
    (copy / "dataset.json").write_text(json.dumps(document))
    report = inspect.build_report(str(copy))
    assert {name: s["records_read"] for name, s in report["splits"].items()} == {"train": 4536, "validation": 464}


def test_preview_sheet(mnist_dataset, tmp_path):
    sheet = tmp_path / "grid.png"
    proc = beam_etl("inspect", mnist_dataset, "--preview", sheet, "--per_class", "3")
    assert proc.returncode == 0, proc.stderr
    assert not list(tmp_path.glob("*.tmp*"))
    dark = np.asarray(Image.open(sheet).convert("L")) < 30  # MNIST digits are white strokes on black; the sheet is white

    def blocks(profile):
        return int(np.sum(np.diff(np.concatenate([[0], profile.astype(int)])) == 1))

    columns = dark.mean(axis=0) > 0.3
    assert blocks(columns) == 3  # columns of thumbnails: 3 per class
    assert blocks(dark[:, columns].mean(axis=1) > 0.3) == 10  # rows: one per digit
    assert (np.asarray(Image.open(sheet).convert("L"))[:, columns] > 200).any()  # white strokes inside the thumbnails
    report = inspect.build_report(str(mnist_dataset), preview_per_class=3)
    assert all(len(items) == 3 for items in report["preview"].values())
    assert all(Image.open(__import__("io").BytesIO(item["image"])).size == (28, 28) for items in report["preview"].values() for item in items)


def test_not_a_dataset_is_a_one_line_error(tmp_path):
    proc = beam_etl("inspect", tmp_path)
    assert proc.returncode == 2 and "no dataset.json" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    proc = beam_etl("inspect", tmp_path, "--per_class", "0", "--preview", tmp_path / "x.png")
    assert proc.returncode == 2 and "--per_class must be at least 1" in proc.stderr
