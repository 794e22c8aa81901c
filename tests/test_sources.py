"""Inputs to references: folder layouts, globs, manifests, splits."""

import pytest

from beam_etl import sources
from beam_etl.sources import ImageRef, InputError


def test_classify():
    assert sources.classify("/data/list.csv").kind == "manifest"
    assert sources.classify("gs://b/list.JSONL").kind == "manifest"
    assert sources.classify("/data/*/*.jpg").kind == "glob"
    assert sources.classify("/data/flowers").kind == "folder"


def test_folder_layouts():
    folder = sources.Source("folder", "/d/root/")
    assert sources.ref_from_path(folder, "/d/root/cat/a/1.jpg", 5) == ImageRef("cat/a/1.jpg", "/d/root/cat/a/1.jpg", "cat", "", 5)
    assert sources.ref_from_path(folder, "/d/root/val/dog/2.jpg", 5).split == "validation"
    assert sources.ref_from_path(folder, "/d/root/train/dog/2.jpg", 5).label == "dog"
    assert sources.ref_from_path(folder, "/d/root/loose.jpg", 5).label == ""
    assert sources.ref_from_path(folder, "/d/root/test/loose.jpg", 5).label == ""


def test_glob_label_is_the_parent_folder():
    glob = sources.Source("glob", "/d/imgs/*/*.jpg")
    ref = sources.ref_from_path(glob, "/d/imgs/bird/x.jpg", 1)
    assert ref.label == "bird" and ref.key == "bird/x.jpg"


def test_hidden_files_are_not_inputs():
    assert sources.is_hidden("cat/.DS_Store") and sources.is_hidden(".git/x")
    assert not sources.is_hidden("cat/a.jpg")


def test_csv_manifest(tmp_path):
    rows = "path,label,split\nimgs/a.jpg,cat,train\n/abs/b.jpg,dog,val\nc.jpg,dog\n\n"
    refs = list(sources.parse_manifest(str(tmp_path / "m.csv"), rows.splitlines(True)))
    assert [r.label for r in refs] == ["cat", "dog", "dog"]
    assert refs[0].uri == str(tmp_path / "imgs/a.jpg") and refs[1].uri == "/abs/b.jpg"
    assert [r.split for r in refs] == ["train", "validation", ""]


def test_jsonl_manifest():
    lines = ['{"path": "a.png", "label": "x"}\n', '{"path": "b.png", "label": "y", "split": "test"}\n']
    refs = list(sources.parse_manifest("gs://b/m.jsonl", lines))
    assert refs[0].uri == "gs://b/a.png" and refs[1].split == "test"


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("m.csv", "a.jpg\n", "m.csv:1: expected path,label"),
        ("m.csv", "a.jpg,\n", "m.csv:1: a row needs a path and a label"),
        ("m.csv", "a.jpg,cat,holdout\n", "unknown split 'holdout'"),
        ("m.jsonl", "{not json\n", "m.jsonl:1: not JSON"),
        ("m.jsonl", "[1, 2]\n", "expected an object"),
    ],
)
def test_bad_manifest_rows_name_the_line(name, text, message):
    with pytest.raises(InputError, match=message.replace("(", r"\(")):
        list(sources.parse_manifest(name, text.splitlines(True)))


def test_split_is_stable_and_near_the_fraction():
    keys = [f"class{i % 7}/img_{i}.jpg" for i in range(20000)]
    first = [sources.assign_split(k, 0.1, 0.05) for k in keys]
    assert first == [sources.assign_split(k, 0.1, 0.05) for k in keys]
    assert abs(first.count("validation") / len(keys) - 0.1) < 0.01
    assert abs(first.count("test") / len(keys) - 0.05) < 0.01


def test_split_of_a_key_survives_new_data():
    # A record's split depends on its key alone, not on what else is in the dataset.
    assert sources.assign_split("cat/1.jpg", 0.2, 0.0) == sources.assign_split("cat/1.jpg", 0.2, 0.0)
    assert {sources.assign_split(f"k{i}", 0.0, 0.0) for i in range(100)} == {"train"}


def test_check_inputs(tmp_path):
    with pytest.raises(InputError, match="no such folder"):
        sources.check_inputs([str(tmp_path / "missing")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no files found"):
        sources.check_inputs([str(tmp_path / "empty")])
    manifest = tmp_path / "m.csv"
    manifest.write_text("a.jpg,cat\n")
    with pytest.raises(InputError, match="label 'cat', which is not in --labels"):
        sources.check_inputs([str(manifest)], labels=["dog"])
    with pytest.raises(InputError, match="no --input"):
        sources.check_inputs([])


def test_check_inputs_counts_what_it_saw(tmp_path, monkeypatch):
    for i in range(7):
        (tmp_path / "imgs" / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        (tmp_path / "imgs" / f"c{i % 2}" / f"{i}.jpg").write_bytes(b"x")
    (tmp_path / "imgs" / "c0" / ".DS_Store").write_bytes(b"x")  # hidden: not an input
    manifest = tmp_path / "m.csv"
    manifest.write_text("a.jpg,cat\nb.jpg,dog\n")
    assert sources.check_inputs([str(tmp_path / "imgs")]) == 7
    assert sources.check_inputs([str(tmp_path / "imgs"), str(manifest)]) == 9
    (tmp_path / "imgs" / "c0" / ".DS_Store").unlink()
    monkeypatch.setattr(sources, "_CHECK_LIMIT", 3)  # a big folder: the listing stops early, a lower bound
    assert sources.check_inputs([str(tmp_path / "imgs")]) == 3


def test_label_names_from_folders_and_manifests(tmp_path):
    for rel in ["train/cat/1.jpg", "train/dog/2.jpg", "validation/eel/3.jpg", ".hidden/x.jpg"]:
        (tmp_path / "root" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "root" / rel).write_bytes(b"x")
    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"path": "z.jpg", "label": "ant"}\n')
    assert sources.label_names([str(tmp_path / "root"), str(manifest)]) == ["ant", "cat", "dog", "eel"]


def test_read_bytes_limits_and_errors(tmp_path):
    from beam_etl.images import Rejected

    path = tmp_path / "a.jpg"
    path.write_bytes(b"x" * 100)
    assert sources.read_bytes(ImageRef("a.jpg", str(path), "l", "", 100), 1000) == b"x" * 100
    with pytest.raises(Rejected, match="too_large"):
        sources.read_bytes(ImageRef("a.jpg", str(path), "l", "", 100), 50)
    with pytest.raises(Rejected, match="too_large"):  # size unknown from the listing (manifest)
        sources.read_bytes(ImageRef("a.jpg", str(path), "l", "", -1), 50)
    with pytest.raises(Rejected, match="unreadable"):
        sources.read_bytes(ImageRef("gone.jpg", str(tmp_path / "gone.jpg"), "l", "", -1), 50)
