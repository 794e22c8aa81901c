"""--dedup and the leakage report: duplicates under other names, classes and splits."""

import json

import pytest

from tests import corpus
from tests.conftest import run_convert
from tests.test_convert_e2e import read_records

pytest.importorskip("tensorflow")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("dups") / "src"
    files = corpus.make_folder(root, seeds=range(9))
    same = files["bee/img_1.jpg"]
    extra = {
        "bee/copy of img_1.jpg": same,  # same bytes, same class
        "cow/img_1 again.jpg": same,  # same bytes, another class
        "validation/ant/leak.jpg": same,  # same bytes, another split
        # Same pixels, other bytes: a lossless PNG of a PNG source.
        "ant/img_0 as png.png": corpus.encode(__import__("PIL.Image", fromlist=["Image"]).open(root / "ant/img_0.png"), "PNG", compress_level=1),
    }
    for rel, data in extra.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    files.update(extra)
    return root, files


def written_keys(out):
    document = json.loads((out / "dataset.json").read_text())
    return document, [r["key"].decode() for split in document["splits"] for r in read_records(out, document, split)]


def test_leakage_is_reported_without_dedup(folder, tmp_path):
    root, files = folder
    out = tmp_path / "ds"
    proc = run_convert("--input", root, "--output", out, "--num_shards", "2")
    document, keys = written_keys(out)
    assert sorted(keys) == sorted(files)  # every input once, duplicates kept
    assert document["leakage"]["images"] == 1
    (group,) = document["leakage"]["groups"]
    assert group["keys"] == {"train": ["bee/copy of img_1.jpg", "bee/img_1.jpg", "cow/img_1 again.jpg"], "validation": ["validation/ant/leak.jpg"]}
    # Three extra copies of img_1, and the PNG pair: same pixels, so the same re-encoded JPEG.
    assert document["duplicates"] == {"extra_copies": 4, "removed": 0}
    assert "leakage: 1 images" in proc.stdout


def test_dedup_keeps_one_of_each_image(folder, tmp_path):
    root, files = folder
    out = tmp_path / "ds"
    run_convert("--input", root, "--output", out, "--num_shards", "2", "--dedup")
    document, keys = written_keys(out)
    rejected = [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]
    removed = {r["key"] for r in rejected if r["reason"] == "duplicate"}
    assert removed == {"bee/img_1.jpg", "cow/img_1 again.jpg", "validation/ant/leak.jpg", "ant/img_0.png"}
    assert all("(kept)" in r["message"] for r in rejected)
    # The reconciliation: inputs = written + rejected, each valid input exactly once.
    assert len(keys) == len(set(keys)) and set(keys) | removed == set(files) and not set(keys) & removed
    assert document["inputs"] == len(keys) + document["rejected"]["total"]
    assert document["duplicates"]["removed"] == 4 and document["leakage"]["images"] == 0
    assert sum(s["examples"] for s in document["splits"]["train"]["shards"]) == sum(document["splits"]["train"]["label_counts"].values())
