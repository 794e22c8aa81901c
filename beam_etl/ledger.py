"""The ledger: one line per input of a dataset, so that an update reads only what changed. No Beam.

A conversion leaves, for each input, written or rejected:

    {"key", "path", "size", "mtime", "sha256", "split", "label", "outcome"}

size and mtime as listed before the read (a bucket object's update time; a local manifest
row's stat), sha256 of the input's bytes as read (None for a reject), outcome "written" or
the reject reason. A written input's line also keeps what its record holds besides the
image, so that the statistics of a whole dataset can be made again without a decode
(training_summary) and a record rebuilt with another label: "stored_sha256", "height",
"width", "example_bytes", "pixel_mean", "pixel_sq_mean". `beam-etl changes` lists the source again and compares each key with
its line: a key whose size and mtime are the same is not read; one whose differ is read
and hashed, and is changed only if its bytes are.
"""

import json
import typing

from beam_etl import trainstats

LEDGER_DIR = "ledger"  # in the dataset folder: gzipped JSON lines, named in dataset.json
PREFIX = "keys"  # the lines of written inputs
REJECTED_PREFIX = "rejected-keys"  # the lines of rejected ones
SUFFIX = ".jsonl.gz"
WRITTEN = "written"

NEW = "new"  # a key the dataset does not have
CHANGED = "changed"  # other bytes, or a reject whose label or bytes may now give another verdict
RELABELLED = "relabelled"  # the same bytes, another label or split (a manifest row): no decode needed
TOUCHED = "touched"  # size or mtime differ, the bytes do not: read once, nothing else to do
REMOVED = "removed"  # in the dataset, no longer in the source
UNCHANGED = "unchanged"  # same size and mtime: not read
CHECK = "check"  # size or mtime differ: read and hash to tell CHANGED from TOUCHED
VERDICTS = (NEW, CHANGED, RELABELLED, TOUCHED, REMOVED, UNCHANGED)


def from_facts(facts, generation: int = 1) -> dict:
    """The line of a written record (records.Facts), written by the conversion of that generation (version)."""
    return {"generation": generation, "key": facts.key, "path": facts.uri, "size": facts.source_bytes, "mtime": facts.mtime, "sha256": facts.source_sha256,
            "split": facts.split, "label": facts.label_text, "outcome": WRITTEN, "stored_sha256": facts.sha256, "height": facts.height,
            "width": facts.width, "example_bytes": facts.nbytes, "pixel_mean": list(facts.pixel_mean), "pixel_sq_mean": list(facts.pixel_sq_mean)}


def from_reject(row: dict, generation: int = 1) -> dict:
    """The line of a rejected input (a records.reject_row)."""
    return {"generation": generation, "key": row["key"], "path": row["path"], "size": row.get("size", -1), "mtime": row.get("mtime"), "sha256": None,
            "split": None, "label": row.get("label", ""), "outcome": row["reason"]}


def training_summary(entries, channels: int) -> dict:
    """trainstats' summary of the training split, from ledger lines: the transform graph's input, no decode."""
    acc = trainstats.empty(channels)
    for entry in entries:
        if entry["outcome"] == WRITTEN and entry["split"] == "train":
            trainstats.add(acc, entry["label"], entry["pixel_mean"], entry["pixel_sq_mean"])
    return trainstats.finish(acc)


def dumps(entry: dict) -> str:
    return json.dumps(entry, ensure_ascii=False, sort_keys=True)


def loads(line: str) -> dict:
    return json.loads(line)


def same_listing(ref, entry: dict) -> bool:
    """The listed size and mtime are the ones recorded; an unknown mtime is never the same."""
    return ref.mtime is not None and entry.get("mtime") is not None and ref.size == entry.get("size") and ref.mtime == entry["mtime"]


def compare(ref, entry: typing.Optional[dict], split: str) -> str:
    """The verdict for a key from its listed ImageRef (None: gone) and its ledger line (None: new).

    split: the split the key would get now (the listing's, or assigned from the key).
    CHECK means: read the bytes and call after_read.
    """
    if entry is None:
        return NEW
    if ref is None:
        return REMOVED
    if not same_listing(ref, entry):
        return CHECK if entry["outcome"] == WRITTEN else CHANGED  # a reject has no hash: convert it again
    return _same_bytes(ref, entry, split, UNCHANGED)


def after_read(ref, entry: dict, split: str, sha256: str) -> str:
    """The verdict for a CHECK key once its bytes are read: CHANGED, RELABELLED or TOUCHED."""
    if sha256 != entry.get("sha256"):
        return CHANGED
    return _same_bytes(ref, entry, split, TOUCHED)


def _same_bytes(ref, entry: dict, split: str, same: str) -> str:
    if entry["outcome"] != WRITTEN:  # a reject: another label may give another verdict
        return CHANGED if ref.label != entry.get("label") else same
    if ref.label != entry.get("label") or split != entry.get("split"):
        return RELABELLED
    return same


def summary_line(counts: dict, data_dir: str, read: int) -> str:
    """One line: what `convert --update` would do, or that nothing changed."""
    listed = sum(counts.get(v, 0) for v in VERDICTS if v != REMOVED)
    work = sum(counts.get(v, 0) for v in (NEW, CHANGED, RELABELLED, REMOVED))
    if not work:
        touched = f"; {counts.get(TOUCHED, 0):,} with a new mtime and the same bytes" if counts.get(TOUCHED) else ""
        return f"no change: the {listed:,} inputs are those of {data_dir}{touched}; {read:,} images read"
    parts = ", ".join(f"{counts.get(v, 0):,} {v}" for v in VERDICTS)
    return f"changes since {data_dir}: {parts}; {read:,} images read to tell changed from touched"
