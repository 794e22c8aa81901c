"""beam-etl compact and gc: versions stay equal to a full conversion while their files shrink (issue 33)."""

import json

from beam_etl import compact, rewrite
from tests.conftest import run_convert
from tests.corpus import jpeg
from tests.test_update import FLAGS, beam_etl, change, manifest_source, records, write_manifest  # noqa: F401 - the fixture

TARGET_MB = 0.15  # this corpus's version-1 shards (~170-250 KB) count as full-size, an update's do not


def doc(out, version=None) -> dict:
    path = out / "dataset.json" if version is None else out / "versions" / f"v{version:05d}.json"
    return json.loads(path.read_text())


def shard(file, examples, nbytes, generation):
    return {"file": file, "examples": examples, "bytes": nbytes, "sha256": "", "generation": generation}


def test_choose_rewrites_small_generations_together_and_any_with_many_dropped_records():
    big = 100e6
    document = {"splits": {"train": {"shards": [shard("a", 1000, big, 1), shard("b", 1000, big, 1), shard("v00002/a", 10, 1e6, 2),
                                                shard("v00003/a", 10, 1e6, 3)]}},
                "excluded": {"records": [[1, f"k{i}"] for i in range(150)]}}
    assert compact.choose(document, big, 0.1) == [2, 3]
    assert compact.choose(document, big, 0.05) == [1, 2, 3]  # 150 of 2,000 dropped: 7.5%
    one_small = {"splits": {"train": {"shards": [shard("a", 1000, big, 1), shard("v00002/a", 10, 1e6, 2)]}}, "excluded": {"records": []}}
    assert compact.choose(one_small, big, 0.1) == []  # rewriting it alone would give it back as it is
    assert compact.choose({"splits": {"train": {"shards": [shard("a", 1000, big, 1)]}}}, big, 0.1) == []


def test_pack_deals_shards_into_groups_of_even_bytes():
    shards = [shard(f"s{i}", 1, b, 1) for i, b in enumerate([50, 40, 30, 20, 10, 10])]
    groups = rewrite.pack(shards, 3)
    assert sorted(sum(s["bytes"] for s in g) for g in groups) == [50, 50, 60]
    assert sorted(s["file"] for g in groups for s in g) == sorted(s["file"] for s in shards)
    assert len(rewrite.pack(shards[:2], 5)) == 2  # never an empty group


def test_compact_and_gc_keep_every_version_equal_to_a_full_conversion(manifest_source, tmp_path):
    manifest, rows, img, out = manifest_source
    v1 = records(out)
    rows = change(rows, img)
    write_manifest(manifest, rows)
    beam_etl("convert", "--update", "--input", manifest, "--output", out)
    for i in range(400, 440, 4):  # version 3: relabel 10 and remove 5 more, among them records of version 2
        rows[i][1] = "cat" if rows[i][1] == "dog" else "dog"
    rows = [r for r in rows if r[0] not in {f"img/{i:04d}.jpg" for i in (1000, 1001, 500, 501, 502)}]
    write_manifest(manifest, rows)
    beam_etl("convert", "--update", "--input", manifest, "--output", out)
    v3 = records(out)
    before = doc(out)
    assert before["version"] == 3 and before["excluded"]["total"] > 0

    proc = beam_etl("compact", out, "--shard_size_mb", TARGET_MB)
    assert "version 4: generations [2, 3] rewritten" in proc.stdout
    after = doc(out)
    assert after["version"] == 4 and after["compacted"]["generations"] == [2, 3]
    assert records(out) == v3  # the same live records: key, split, stored sha256, label
    generations = {s["generation"] for split in after["splits"].values() for s in split["shards"]}
    assert generations == {1, 4}  # version 1's full-size shards kept, 2 and 3 merged
    assert all(g == 1 for g, _ in after["excluded"]["records"])  # the dropped records of 2 and 3 are gone
    for name, split in after["splits"].items():
        assert split["examples"] == before["splits"][name]["examples"]
        assert split["label_counts"] == before["splits"][name]["label_counts"]
    assert after["statistics"] == before["statistics"]
    for version in (None, 1, 2, 3):
        args = () if version is None else ("--version", version)
        assert "OK" in beam_etl("verify", out, *args).stdout
    assert records(out, 1) == v1

    # The ledger follows the moved records: a later update excludes the right copy.
    for i in range(600, 610):
        (img / f"{i:04d}.jpg").write_bytes(jpeg(33, 27, seed=20_000 + i))  # version 1's records, other bytes
    moved = next(r for r in rows if r[0] == "img/1002.jpg")  # a record of version 2, which compaction moved
    moved[1] = "dog" if moved[1] == "cat" else "cat"
    rows = [r for r in rows if r[0] != "img/1003.jpg"]  # and one removed
    write_manifest(manifest, rows)
    beam_etl("convert", "--update", "--input", manifest, "--output", out)
    full = tmp_path / "full"
    run_convert("--input", manifest, "--output", full, *FLAGS)
    assert records(out) == records(full)
    assert doc(out)["version"] == 5

    # Small generations merge again (4, the last compaction's, and 5); after that there is nothing to do.
    latest = records(out)
    proc = beam_etl("compact", out, "--shard_size_mb", TARGET_MB)
    assert "version 6: generations [4, 5] rewritten" in proc.stdout
    assert records(out) == latest
    proc = beam_etl("compact", out, "--shard_size_mb", TARGET_MB)
    assert "already compact" in proc.stdout and doc(out)["version"] == 6

    # gc removes what only versions 1-4 name, and nothing else.
    (out / "NOTES.txt").write_text("mine")
    (out / "v00002" / "mine.txt").write_text("mine too")
    proc = beam_etl("gc", out, "--keep", 2)
    assert "kept versions 5..6; removed versions 1..4: " in proc.stdout
    assert not (out / "versions" / "v00001.json").exists() and (out / "versions" / "v00005.json").exists()
    assert not list((out / "v00002").glob("*.tfrecord")) and not (out / "v00003").exists()
    assert (out / "NOTES.txt").exists() and (out / "v00002" / "mine.txt").exists()
    assert list(out.glob("train-*.tfrecord"))  # version 1's shards: versions 5 and 6 still name them
    for version in (None, 5):
        args = () if version is None else ("--version", version)
        assert "OK" in beam_etl("verify", out, *args).stdout
    proc = beam_etl("verify", out, "--version", 2, check=False)
    assert proc.returncode == 2 and "has no version 2: its versions are 5..6" in proc.stderr
    assert records(out) == latest
    kept = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    named = set()
    for version in (5, 6):
        d = doc(out, None if version == 6 else version)
        named |= {s["file"] for split in d["splits"].values() for s in split["shards"]} | set(d["ledger"]["files"])
    shards_and_ledgers = {f for f in kept if f.endswith(".tfrecord") or f.startswith("ledger/")}
    assert shards_and_ledgers == named  # every shard and ledger file left is one a kept version names
    assert "no older version to remove" in beam_etl("gc", out, "--keep", 2).stdout


def test_compact_and_gc_refuse_clearly(tmp_path):
    assert beam_etl("gc", tmp_path / "none", "--keep", 1, check=False).returncode == 2
    img = tmp_path / "img" / "cat"
    img.mkdir(parents=True)
    for i in range(6):
        (img / f"{i}.jpg").write_bytes(jpeg(20, 20, seed=i))
    out = tmp_path / "out"
    run_convert("--input", tmp_path / "img", "--output", out, "--compression", "gzip")
    proc = beam_etl("compact", out, check=False)
    assert proc.returncode == 2 and "gzip shards, which compact does not rewrite yet" in proc.stderr
    proc = beam_etl("gc", out, "--keep", 0, check=False)
    assert proc.returncode == 2 and "--keep must be 1 or more" in proc.stderr
    assert "no older version to remove" in beam_etl("gc", out, "--keep", 1).stdout
