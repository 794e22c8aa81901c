"""The robustness corpus through the real converter: every input once, written or rejected with its reason."""

import json
import re

import pytest

from tests import corpus
from tests.conftest import run_convert
from tests.test_convert_e2e import read_records

pytest.importorskip("tensorflow")


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus") / "src"
    expected = corpus.robustness_corpus(root)
    # A manifest beside it: rows for files that vanished (unreadable) and one of the corpus files.
    manifest = root.parent / "extra.csv"
    manifest.write_text("path,label\nsrc/formats/png.png,from_manifest\nsrc/gone/missing.jpg,from_manifest\n")
    return root, manifest, expected


def convert(source, out, *flags):
    root, manifest, _ = source
    run_convert("--input", root, "--input", manifest, "--output", out, "--max_reject_fraction", "1", *flags)
    document = json.loads((out / "dataset.json").read_text())
    written = [r["key"].decode() for split in document["splits"] for r in read_records(out, document, split)]
    rejected = [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]
    return document, written, rejected


def test_reconciliation(source, tmp_path):
    root, manifest, expected = source
    document, written, rejected = convert(source, tmp_path / "ds")
    reasons = {r["key"]: r["reason"] for r in rejected}
    inputs = set(expected) | {"src/formats/png.png", "src/gone/missing.jpg"}
    assert document["inputs"] == len(inputs) == len(written) + len(rejected)
    assert len(written) == len(set(written)) and set(written) | set(reasons) == inputs and not set(written) & set(reasons)
    assert reasons.pop("src/gone/missing.jpg") == "unreadable"
    for key, reason in expected.items():
        if reason is None:
            assert key in written, f"{key} should have been converted, got {reasons.get(key)}"
        elif key in reasons:
            assert re.fullmatch(reason, reasons[key]), f"{key}: {reasons[key]}"
        else:
            assert "ok" in reason.split("|"), f"{key} should have been rejected as {reason}"
    assert all(r["message"] and r["path"] for r in rejected)
    assert document["leakage"]["images"] == 0 and document["duplicates"]["extra_copies"] >= 3


def test_reconciliation_with_dedup(source, tmp_path):
    _, _, expected = source
    document, written, rejected = convert(source, tmp_path / "ds", "--dedup")
    removed = {r["key"] for r in rejected if r["reason"] == "duplicate"}
    assert {"dups/a.jpg", "dups_other_class/b.jpg"} <= removed | set(written)
    assert len({"dups/a.jpg", "dups_other_class/b.jpg", "names/\u00e9t\u00e9 \u65e5\u672c photo.jpg"} & set(written)) == 1
    assert document["inputs"] == len(written) + len(rejected) and len(written) == len(set(written))
    assert document["duplicates"]["removed"] == len(removed) >= 3
