"""convert --update: a new version from what changed, equal to a full conversion of the new source (issue 33)."""

import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT, kill_when, run_convert
from tests.corpus import jpeg

ENV = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")

READ_VERSION = r"""
import json, sys
import tensorflow as tf
data_dir, version = sys.argv[1], int(sys.argv[2])
path = data_dir + ("/dataset.json" if version == 0 else f"/versions/v{version:05d}.json")
doc = json.loads(tf.io.gfile.GFile(path).read())
names = {role: f["name"] for role, f in doc["features"].items()}
spec = {names[r]: tf.io.FixedLenFeature([], tf.string if r in ("key", "sha256", "label_text") else tf.int64) for r in ("key", "sha256", "label_text", "label")}
dropped = {(g, k) for g, k in doc.get("excluded", {}).get("records", [])}
out = {}
for split, info in doc["splits"].items():
    for shard in info["shards"]:
        for raw in tf.data.TFRecordDataset(data_dir + "/" + shard["file"]):
            rec = {k: v.numpy() for k, v in tf.io.parse_single_example(raw, spec).items()}
            key = rec[names["key"]].decode()
            if (shard.get("generation", 1), key) in dropped:
                continue
            assert key not in out, key
            out[key] = [split, rec[names["sha256"]].decode(), rec[names["label_text"]].decode(), int(rec[names["label"]])]
print(json.dumps(out))
"""


def records(data_dir, version=0) -> dict:
    """{key: [split, sha256 of the stored image, label text, label id]} of a version's live records (0: the latest)."""
    proc = subprocess.run([sys.executable, "-c", READ_VERSION, str(data_dir), str(version)], capture_output=True, text=True, env=ENV, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def beam_etl(*args, check=True):
    proc = subprocess.run([sys.executable, "-m", "beam_etl", *map(str, args)], capture_output=True, text=True, env=ENV, cwd=ROOT)
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def write_manifest(path, rows):
    path.write_text("path,label\n" + "".join(f"{p},{label}\n" for p, label in rows))


def update_on_another_runner(root, tmp_path, beam_etl_call, runner_flags):
    """Convert 100 digits of `root` (label folders) by manifest, change them, `--update` with runner_flags: equal to a full conversion."""
    import shutil

    copies = tmp_path / "copies"
    copies.mkdir()
    rows = []
    for label in sorted(os.listdir(root)):
        names = [n for n in sorted(os.listdir(root / label)) if not n.startswith(("copy-", "truncated", "notes"))]
        for name in names[:10]:
            shutil.copy(root / label / name, copies / f"{label}-{name}")  # copies: a change may overwrite them
            rows.append([str(copies / f"{label}-{name}"), label])
    manifest = tmp_path / "m.csv"
    args = ["--channels", "1", "--validation_fraction", "0.2", "--num_shards", "2"]
    out, full = tmp_path / "ds", tmp_path / "full"
    write_manifest(manifest, rows)
    run_convert("--input", manifest, "--output", out, *args)
    for i in (3, 4):  # other bytes: another digit's
        shutil.copy(root / "9" / sorted(os.listdir(root / "9"))[30 + i], rows[i][0])
    for i in (20, 21, 22):
        rows[i][1] = "1" if rows[i][1] != "1" else "2"
    rows = rows[:50] + rows[54:]  # 4 removed
    rows += [[str(root / "0" / n), "0"] for n in sorted(os.listdir(root / "0"))[40:45]]  # 5 new
    write_manifest(manifest, rows)
    proc = beam_etl_call("convert", "--update", "--input", manifest, "--output", out, *runner_flags)
    line = next(x for x in proc.stdout.splitlines() if x.startswith("beam-etl: version 2"))
    assert "5 new, 2 changed, 3 relabelled, 0 touched, 4 removed" in line, line
    run_convert("--input", manifest, "--output", full, *args)
    assert records(out) == records(full) and len(records(out)) == 101
    assert "OK" in beam_etl("verify", out, "--version", "1").stdout
    assert not [p.name for p in out.iterdir() if p.name.startswith((".staging-", "beam-temp-", "tft_tmp"))]
    return proc


FLAGS = ("--validation_fraction", "0.2", "--num_shards", "train=4,validation=2")


@pytest.fixture
def manifest_source(tmp_path):
    """1,000 small photos named in a manifest, converted once: (manifest, rows, image folder, dataset)."""
    img = tmp_path / "img"
    img.mkdir()
    rows = []
    for i in range(1000):
        (img / f"{i:04d}.jpg").write_bytes(jpeg(24 + i % 17, 20 + i % 13, seed=i))
        rows.append([f"img/{i:04d}.jpg", "cat" if i % 2 else "dog"])
    manifest = tmp_path / "m.csv"
    write_manifest(manifest, rows)
    out = tmp_path / "out"
    run_convert("--input", manifest, "--output", out, *FLAGS)
    return manifest, rows, img, out


def change(rows, img):
    """Add 50, change the bytes of 10, relabel 5, delete 20 (the issue's 1%-style change, scaled to 1,000)."""
    for i in range(1000, 1050):
        (img / f"{i:04d}.jpg").write_bytes(jpeg(30, 30, seed=i))
        rows.append([f"img/{i:04d}.jpg", "cat"])
    for i in range(100, 110):
        (img / f"{i:04d}.jpg").write_bytes(jpeg(31, 29, seed=10_000 + i))
    for i in range(200, 210, 2):
        rows[i][1] = "cat" if rows[i][1] == "dog" else "dog"
    removed = {f"img/{i:04d}.jpg" for i in range(300, 320)}
    return [r for r in rows if r[0] not in removed]


def test_update_converts_only_new_and_changed_and_equals_a_full_conversion(manifest_source, tmp_path):
    manifest, rows, img, out = manifest_source
    before = records(out)
    no_change = beam_etl("convert", "--update", "--input", manifest, "--output", out)
    assert no_change.stdout.strip().splitlines()[-1] == f"beam-etl: no change: the 1,000 inputs are those of {out}; 0 images read; no version written"
    assert not (out / "versions").exists() and not (out / "v00002").exists()
    rows = change(rows, img)
    write_manifest(manifest, rows)
    proc = beam_etl("convert", "--update", "--input", manifest, "--output", out)
    line = next(line for line in proc.stdout.splitlines() if line.startswith("beam-etl: version 2"))
    assert line == (f"beam-etl: version 2 of {out}: 50 new, 10 changed, 5 relabelled, 0 touched, 20 removed, 965 unchanged; "
                    "10 read to tell changed from touched; 60 converted, 5 relabelled without a decode")
    full = tmp_path / "full"
    run_convert("--input", manifest, "--output", full, *FLAGS)
    assert records(out) == records(full)
    assert len(records(out)) == 1030
    document, full_doc = (json.loads((d / "dataset.json").read_text()) for d in (out, full))
    assert document["version"] == 2 and document["inputs"] == full_doc["inputs"] == 1030
    for name in ("train", "validation"):
        assert document["splits"][name]["examples"] == full_doc["splits"][name]["examples"]
        assert document["splits"][name]["label_counts"] == full_doc["splits"][name]["label_counts"]
    assert document["statistics"]["label_frequencies"] == full_doc["statistics"]["label_frequencies"]
    assert document["statistics"]["pixel_mean"] == pytest.approx(full_doc["statistics"]["pixel_mean"], abs=1e-3)
    assert document["statistics"]["pixel_std"] == pytest.approx(full_doc["statistics"]["pixel_std"], abs=1e-3)
    # Version 1 is untouched: it verifies and reads exactly as before; so does version 2.
    assert records(out, 1) == before
    for version in (1, 2):
        assert "OK" in beam_etl("verify", out, "--version", version).stdout
    assert beam_etl("verify", out, "--version", 3, check=False).returncode == 2
    # The trainer reads the latest, or a pinned version, with exactly the live records.
    counted = subprocess.run([sys.executable, "-c", (
        "import sys; from trainer.dataset import DatasetInfo; from trainer.input import make_dataset\n"
        "for v in (None, 1):\n"
        "    info = DatasetInfo.load(sys.argv[1], v)\n"
        "    print(sum(int(b[1].shape[0]) for b in make_dataset(info, 'train', 64, training=False, image_size=8)), info.examples('train'))"
    ), str(out)], capture_output=True, text=True, env=ENV, cwd=ROOT)
    assert counted.returncode == 0, counted.stderr[-2000:]
    latest, pinned = (line.split() for line in counted.stdout.strip().splitlines()[-2:])
    assert latest[0] == latest[1] == str(full_doc["splits"]["train"]["examples"])
    assert pinned[0] == pinned[1] == str(sum(1 for r in before.values() if r[0] == "train"))
    # A second update with no change writes nothing.
    again = beam_etl("convert", "--update", "--input", manifest, "--output", out)
    assert again.stdout.strip().splitlines()[-1].startswith("beam-etl: no change: the 1,030 inputs")
    assert not (out / "v00003").exists()


def test_a_killed_update_leaves_version_1_and_a_second_update_completes(manifest_source, tmp_path):
    manifest, rows, img, out = manifest_source
    before = records(out)
    write_manifest(manifest, change(rows, img))
    cmd = [sys.executable, "-m", "beam_etl", "convert", "--update", "--input", str(manifest), "--output", str(out)]
    proc = subprocess.Popen(cmd, env=dict(ENV, BEAM_ETL_TEST_SHARD_PAUSE="3", PYTHONPATH=ROOT + os.pathsep + os.path.join(ROOT, "tests", "slow_shards")),
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    killed = kill_when(proc, lambda: any(out.glob(".staging-*/shards/*")), poll=0.02)
    assert killed, "no shard was ever staged: the update finished or hung first"
    assert json.loads((out / "dataset.json").read_text()).get("version", 1) == 1
    assert "OK" in beam_etl("verify", out).stdout
    assert records(out) == before
    beam_etl("convert", "--update", "--input", manifest, "--output", out)
    assert json.loads((out / "dataset.json").read_text())["version"] == 2
    full = tmp_path / "full"
    run_convert("--input", manifest, "--output", full, *FLAGS)
    assert records(out) == records(full)
    assert not list(out.glob(".staging-*"))


def test_update_refuses_new_labels_and_missing_datasets(manifest_source, tmp_path):
    manifest, rows, img, out = manifest_source
    rows.append(["img/0000.jpg".replace("0000", "0001"), "bird"])
    write_manifest(manifest, rows)
    proc = beam_etl("convert", "--update", "--input", manifest, "--output", out, check=False)
    assert proc.returncode == 2
    assert re.search(r"the inputs have labels \['bird'\] that .* lacks .*convert with --overwrite to add labels", proc.stderr.strip().splitlines()[-1])
    proc = beam_etl("convert", "--update", "--input", manifest, "--output", tmp_path / "none", check=False)
    assert proc.returncode == 2 and "--update needs a dataset in --output" in proc.stderr.strip().splitlines()[-1]


def test_update_of_an_indexed_dataset_indexes_its_new_shards(tmp_path):
    """--write_index is one of the options an update keeps: each new shard gets its DALI index too."""
    img = tmp_path / "img"
    img.mkdir()
    rows = []
    for i in range(40):
        (img / f"{i:02d}.jpg").write_bytes(jpeg(30 + i, 20, seed=i))
        rows.append([f"img/{i:02d}.jpg", "ab"[i % 2]])
    manifest, out = tmp_path / "m.csv", tmp_path / "out"
    write_manifest(manifest, rows)
    run_convert("--input", manifest, "--output", out, "--num_shards", "2", "--write_index")
    (img / "new.jpg").write_bytes(jpeg(33, 33, seed=99))
    write_manifest(manifest, rows[1:] + [["img/new.jpg", "a"]])
    beam_etl("convert", "--update", "--input", manifest, "--output", out)
    document = json.loads((out / "dataset.json").read_text())
    new = [s for s in document["splits"]["train"]["shards"] if s["generation"] == 2]
    assert new and all(s.get("index") and (out / (s["file"] + ".idx")).exists() for s in new)
    assert "OK" in beam_etl("verify", out).stdout
    assert len(records(out)) == 40
    # compact keeps the option too: its new shards are indexed.
    assert "version 3: generations [1, 2] rewritten" in beam_etl("compact", out).stdout
    shards = json.loads((out / "dataset.json").read_text())["splits"]["train"]["shards"]
    assert {s["generation"] for s in shards} == {3} and all(s.get("index") and (out / (s["file"] + ".idx")).exists() for s in shards)
    assert "OK" in beam_etl("verify", out).stdout
    assert len(records(out)) == 40
