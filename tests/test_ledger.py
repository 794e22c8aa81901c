"""The ledger a conversion leaves, and `beam-etl changes` against it (issue 33, step 1)."""

import gzip
import hashlib
import json
import os
import subprocess
import sys

import pytest

from beam_etl import ledger
from beam_etl.sources import ImageRef
from tests.conftest import ROOT, run_convert
from tests.corpus import jpeg


def _ref(key="a/1.jpg", size=10, mtime=1.5, label="a", split=""):
    return ImageRef(key, f"/src/{key}", label, split, size, mtime)


def _entry(size=10, mtime=1.5, label="a", split="train", outcome=ledger.WRITTEN, sha="s1"):
    return {"key": "a/1.jpg", "size": size, "mtime": mtime, "label": label, "split": split, "outcome": outcome, "sha256": sha}


def test_compare_reads_only_what_the_listing_says_changed():
    assert ledger.compare(_ref(), None, "train") == ledger.NEW
    assert ledger.compare(None, _entry(), None) == ledger.REMOVED
    assert ledger.compare(_ref(), _entry(), "train") == ledger.UNCHANGED
    assert ledger.compare(_ref(label="b"), _entry(), "train") == ledger.RELABELLED
    assert ledger.compare(_ref(), _entry(), "validation") == ledger.RELABELLED  # a manifest row moved to another split
    assert ledger.compare(_ref(mtime=2.0), _entry(), "train") == ledger.CHECK
    assert ledger.compare(_ref(size=11), _entry(), "train") == ledger.CHECK
    assert ledger.compare(_ref(mtime=None), _entry(), "train") == ledger.CHECK  # unknown: never taken as the same
    # A reject has no hash: new metadata, or a new label, converts it again; otherwise it stays a reject unread.
    reject = _entry(outcome="decode_error", sha=None, split=None)
    assert ledger.compare(_ref(mtime=2.0), reject, "train") == ledger.CHANGED
    assert ledger.compare(_ref(label="b"), reject, "train") == ledger.CHANGED
    assert ledger.compare(_ref(), reject, "train") == ledger.UNCHANGED


def test_after_read_tells_changed_from_touched():
    assert ledger.after_read(_ref(mtime=2.0), _entry(), "train", "s2") == ledger.CHANGED
    assert ledger.after_read(_ref(mtime=2.0), _entry(), "train", "s1") == ledger.TOUCHED
    assert ledger.after_read(_ref(mtime=2.0, label="b"), _entry(), "train", "s1") == ledger.RELABELLED


def test_summary_line_says_no_change_in_one_line():
    line = ledger.summary_line({ledger.UNCHANGED: 1000, ledger.TOUCHED: 2}, "/d", 2)
    assert line == "no change: the 1,002 inputs are those of /d; 2 with a new mtime and the same bytes; 2 images read"
    line = ledger.summary_line({ledger.NEW: 1, ledger.REMOVED: 2, ledger.UNCHANGED: 5}, "/d", 0)
    assert line.startswith("changes since /d: 1 new, 0 changed, 0 relabelled, 0 touched, 2 removed, 5 unchanged")


def _lines(data_dir) -> dict:
    document = json.loads((data_dir / "dataset.json").read_text())
    out = {}
    for name in document["ledger"]["files"]:
        with gzip.open(data_dir / name, "rt") as f:
            for line in f:
                entry = json.loads(line)
                assert entry["key"] not in out, f"{entry['key']} twice in the ledger"
                out[entry["key"]] = entry
    assert len(out) == document["ledger"]["entries"] == document["inputs"]
    return out


def _changes(*args) -> str:
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, "-m", "beam_etl", "changes", *map(str, args)], capture_output=True, text=True, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


@pytest.fixture
def folder_dataset(tmp_path):
    src = tmp_path / "src"
    for i in range(24):
        (src / "ab"[i % 2]).mkdir(parents=True, exist_ok=True)
        (src / "ab"[i % 2] / f"{i:02d}.jpg").write_bytes(jpeg(40 + i, 30, seed=i))
    (src / "a" / "broken.jpg").write_bytes(jpeg(40, 30, seed=99)[:200])
    out = tmp_path / "out"
    run_convert("--input", src, "--output", out, "--num_shards", "2", "--validation_fraction", "0.25", "--max_reject_fraction", "0.5")
    return src, out


def test_every_input_has_one_ledger_line_with_its_listing_and_hash(folder_dataset):
    src, out = folder_dataset
    lines = _lines(out)
    assert set(lines) == {f"{p.parent.name}/{p.name}" for p in src.rglob("*.jpg")}
    for key, entry in lines.items():
        path = src / key
        assert (entry["path"], entry["size"], entry["mtime"]) == (str(path), path.stat().st_size, path.stat().st_mtime)
        if key == "a/broken.jpg":
            assert entry["outcome"] not in (ledger.WRITTEN, None) and entry["sha256"] is None
        else:
            assert entry["outcome"] == ledger.WRITTEN and entry["label"] == key[0]
            assert entry["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    splits = {e["split"] for e in lines.values() if e["outcome"] == ledger.WRITTEN}
    assert splits == {"train", "validation"}


def test_the_ledger_alone_gives_the_datasets_statistics_and_records(folder_dataset):
    """What an update needs to analyse a whole version again, and to rebuild a record, without a decode."""
    import tensorflow as tf

    from beam_etl import trainstats

    _, out = folder_dataset
    lines = _lines(out)
    document = json.loads((out / "dataset.json").read_text())
    summary = ledger.training_summary(lines.values(), document["channels"])
    statistics = document["statistics"]
    assert summary["label_counts"] == statistics["label_frequencies"] == document["splits"]["train"]["label_counts"]
    assert summary["pixel_mean"] == pytest.approx(statistics["pixel_mean"], abs=1e-4)
    assert trainstats.pixel_std(summary) == pytest.approx(statistics["pixel_std"], abs=1e-4)
    names = {role: spec["name"] for role, spec in document["features"].items()}
    seen = 0
    for split, info in document["splits"].items():
        for raw in tf.data.TFRecordDataset([str(out / s["file"]) for s in info["shards"]]):
            example = tf.train.Example.FromString(raw.numpy())
            feature = lambda role: example.features.feature[names[role]]  # noqa: E731
            entry = lines[feature("key").bytes_list.value[0].decode()]
            assert (entry["split"], entry["label"]) == (split, feature("label_text").bytes_list.value[0].decode())
            assert entry["stored_sha256"] == feature("sha256").bytes_list.value[0].decode()
            assert (entry["height"], entry["width"]) == (feature("height").int64_list.value[0], feature("width").int64_list.value[0])
            assert entry["example_bytes"] == len(raw.numpy())
            seen += 1
    assert seen == sum(e["outcome"] == ledger.WRITTEN for e in lines.values())


def test_changes_reads_only_keys_whose_listing_changed(folder_dataset):
    src, out = folder_dataset
    assert _changes("--input", src, "--output", out) == f"no change: the 25 inputs are those of {out}; 0 images read"
    (src / "b" / "new.jpg").write_bytes(jpeg(50, 50, seed=200))  # new
    (src / "a" / "00.jpg").write_bytes(jpeg(41, 31, seed=201))  # changed bytes
    os.utime(src / "a" / "02.jpg", (1, 1))  # touched: same bytes, another mtime
    (src / "b" / "01.jpg").unlink()  # removed
    os.rename(src / "b" / "03.jpg", src / "a" / "03.jpg")  # moved between label folders: removed + new
    line = _changes("--input", src, "--output", out)
    assert line == (f"changes since {out}: 2 new, 1 changed, 0 relabelled, 1 touched, 2 removed, 21 unchanged; "
                    "2 images read to tell changed from touched")


def test_changes_on_a_manifest_sees_relabels_and_splits_without_reading(tmp_path):
    src = tmp_path / "img"
    src.mkdir()
    rows = []
    for i in range(20):
        (src / f"{i:02d}.jpg").write_bytes(jpeg(40 + i, 30, seed=i))
        rows.append([f"img/{i:02d}.jpg", "cat" if i % 2 else "dog", "validation" if i < 4 else "train"])
    manifest = tmp_path / "m.csv"
    manifest.write_text("".join(",".join(r) + "\n" for r in rows))
    out = tmp_path / "out"
    run_convert("--input", manifest, "--output", out, "--num_shards", "1")
    lines = _lines(out)
    assert lines["img/05.jpg"]["mtime"] == (src / "05.jpg").stat().st_mtime  # a local manifest row is stat'ed
    assert _changes("--input", manifest, "--output", out).startswith("no change: the 20 inputs")
    rows[5][1] = "dog"  # relabelled
    rows[6][2] = "validation"  # another split
    (src / "07.jpg").write_bytes(jpeg(30, 30, seed=77))  # changed
    del rows[8]  # removed
    rows.append(["img/05.jpg".replace("05", "new"), "cat", ""])
    (src / "new.jpg").write_bytes(jpeg(33, 33, seed=78))  # new
    manifest.write_text("".join(",".join(r) + "\n" for r in rows))
    line = _changes("--input", manifest, "--output", out)
    assert line == (f"changes since {out}: 1 new, 1 changed, 2 relabelled, 0 touched, 1 removed, 16 unchanged; "
                    "1 images read to tell changed from touched")


def test_changes_refuses_a_folder_that_is_no_dataset(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "1.jpg").write_bytes(jpeg())
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-m", "beam_etl", "changes", "--input", str(tmp_path), "--output", str(tmp_path / "none")],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == f"beam-etl: {tmp_path / 'none'} has no dataset.json: convert into it first (beam-etl convert --input ... --output {tmp_path / 'none'})"


def test_compare_with_ledger_joins_keys_across_several_buckets(folder_dataset):
    """The PTransform itself, with a document that asks for 3 buckets: every key lands in one, once."""
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    from beam_etl import changes

    src, out = folder_dataset
    document = json.loads((out / "dataset.json").read_text())
    document["ledger"]["entries"] = 2 * changes.KEYS_PER_BUCKET + 1
    assert changes.bucket_count(document["ledger"]["entries"]) == 3
    assert len({changes.bucket_of(f"a/{i:02d}.jpg", 3) for i in range(24)}) == 3
    (src / "b" / "new.jpg").write_bytes(jpeg(50, 50, seed=200))
    (src / "a" / "00.jpg").write_bytes(jpeg(41, 31, seed=201))
    os.utime(src / "a" / "02.jpg", (1, 1))
    (src / "b" / "01.jpg").unlink()
    with TestPipeline() as p:
        verdicts = p | changes.CompareWithLedger([str(src)], str(out), document)
        assert_that(verdicts, equal_to([("new", "b/new.jpg"), ("changed", "a/00.jpg"), ("touched", "a/02.jpg"), ("removed", "b/01.jpg")]))


def test_batches_hold_at_most_batch_items_per_bucket():
    from beam_etl import changes

    pairs = [(f"k{i}", i) for i in range(5 * changes.BATCH + 7)]
    batches = list(changes._batched(pairs, 4))
    assert all(len(items) <= changes.BATCH for _, items in batches)
    assert sorted(i for _, items in batches for i in items) == list(range(len(pairs)))
    for bucket, items in batches:
        assert {changes.bucket_of(f"k{i}", 4) for i in items} == {bucket}
