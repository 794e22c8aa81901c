"""dataset.json: build it, publish the dataset atomically around it, read it back."""

import datetime
import json
import os
import posixpath
import re
import uuid

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_etl import ledger, objstore, schema

DATASET_JSON = "dataset.json"
REJECTED_JSONL = "rejected.jsonl"
TRANSFORM_DIRS = ("transform_fn", "transformed_metadata")
_SHARD = re.compile(r"^[a-z]+-\d{5}-of-\d{5}\.tfrecord(\.gz|\.idx)?$")  # .idx: a DALI index, replaced with its shard
FORMAT_VERSION = 1


class IncompleteDataset(Exception):
    """The run's outputs do not add up; nothing is published."""


class TooManyRejects(Exception):
    """More inputs were rejected than --max_reject_fraction allows."""


def versions() -> dict:
    """The versions of what made the dataset."""
    from importlib import metadata

    out = {}
    for dist in ("beam-image-etl", "apache-beam", "tensorflow", "tensorflow-transform", "pillow", "numpy"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


MAX_LISTED_LEAKS = 100  # dataset.json lists this many leakage groups with their keys, and counts all


def build(*, options: dict, label_names, shards, label_counts, reject_counts, inputs: int, fingerprint: str, statistics: dict, leaks=(), duplicates=(), workers=(), ledger_files=()) -> dict:
    """The dataset.json document; raises IncompleteDataset when the counts do not reconcile."""
    splits = {}
    for info in sorted(shards, key=lambda s: (s["split"], s["index"])):
        split = splits.setdefault(info["split"], {"examples": 0, "bytes": 0, "label_counts": {}, "shards": []})
        split["examples"] += info["examples"]
        split["bytes"] += info["bytes"]
        split["shards"].append({k: info[k] for k in ("file", "examples", "bytes", "sha256")})
        if info.get("indexed"):
            split["shards"][-1]["index"] = split["index"] = True
    encoded = {}
    for (split, label), n in label_counts:
        encoded[split] = encoded.get(split, 0) + n
        if split in splits:
            splits[split]["label_counts"][label] = n
    for name, split in splits.items():
        counts = {info["count"] for info in shards if info["split"] == name}
        indices = sorted(info["index"] for info in shards if info["split"] == name)
        if len(counts) != 1 or indices != list(range(counts.pop())):
            raise IncompleteDataset(f"split {name}: shard set is incomplete or duplicated: indices {indices}")
        if split["examples"] != encoded.get(name, 0):
            raise IncompleteDataset(f"split {name}: {split['examples']} records in shards but {encoded.get(name, 0)} encoded")
    missing = set(encoded) - set(splits)
    if missing:
        raise IncompleteDataset(f"splits {sorted(missing)} were encoded but have no shards")
    rejected = sum(reject_counts.values())
    written = sum(s["examples"] for s in splits.values())
    if written + rejected != inputs:
        raise IncompleteDataset(f"{inputs} inputs but {written} written + {rejected} rejected: records were lost or duplicated")
    from beam_etl import trainstats

    compression = options["compression"]
    return {
        "format_version": FORMAT_VERSION,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "schema": options["schema"],
        "features": schema.feature_spec_json(options["schema"]),
        "label_names": list(label_names),
        "num_classes": len(label_names),
        "channels": options["channels"],
        "image_format": options["image_format"],
        "compression": compression,
        "tfrecord_compression": "GZIP" if compression == "gzip" else "",
        "splits": splits,
        "statistics": statistics,
        "transform": trainstats.transform_contract(options["channels"]),
        "rejected": {"total": rejected, "by_reason": dict(sorted(reject_counts.items())), "file": REJECTED_JSONL},
        # Same stored bytes more than once; 'removed' are the ones --dedup dropped (same pixels).
        "duplicates": {"extra_copies": sum(duplicates), "removed": reject_counts.get("duplicate", 0)},
        # Images stored in more than one split: train/validation leakage.
        "leakage": {"images": len(leaks), "groups": sorted(leaks, key=lambda g: g["sha256"])[:MAX_LISTED_LEAKS]},
        "inputs": inputs,
        "options": options,
        "versions": versions(),
        "source_fingerprint": fingerprint,
        # SDK worker processes that listed or encoded (runners.check_in): how parallel the run was.
        "worker_processes": len(set(workers)),
        # One line per input (ledger.py): what `beam-etl changes` compares a source with.
        "ledger": {"entries": inputs, "files": [f"{ledger.LEDGER_DIR}/{name}" for name in sorted(ledger_files)]},
    }


def check_reject_fraction(rejected: int, inputs: int, max_fraction: float, output: str) -> None:
    if inputs and rejected / inputs > max_fraction:
        raise TooManyRejects(
            f"{rejected} of {inputs} inputs ({rejected / inputs:.1%}) were rejected, over --max_reject_fraction "
            f"{max_fraction:g}; see {FileSystems.join(output, REJECTED_JSONL)} for each file and its reason"
        )


def write_json(path: str, document: dict) -> None:
    """Write JSON atomically: a temporary name, then a rename."""
    temp = f"{path}.{uuid.uuid4().hex}.tmp"
    with FileSystems.create(temp, mime_type="application/json", compression_type=CompressionTypes.UNCOMPRESSED) as f:
        f.write(json.dumps(document, indent=2, sort_keys=False).encode("utf-8"))
    if FileSystems.exists(path):
        FileSystems.delete([path])
    FileSystems.rename([temp], [path])


def read(data_dir: str) -> dict:
    path = FileSystems.join(data_dir, DATASET_JSON)
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        return json.loads(f.read().decode("utf-8"))


VERSIONS_DIR = "versions"  # each version's document once a dataset is updated (convert --update)


def version_json(version: int) -> str:
    """A version's document, relative to the dataset folder."""
    return f"{VERSIONS_DIR}/v{version:05d}.json"


def read_version(data_dir: str, version=None) -> dict:
    """Version `version`'s document (versions/vNNNNN.json, written by convert --update); None: the latest."""
    if version is None:
        return read(data_dir)
    path = FileSystems.join(data_dir, version_json(version))
    if FileSystems.exists(path):
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            return json.loads(f.read().decode("utf-8"))
    document = read(data_dir)
    latest = int(document.get("version", 1))
    if latest != version:
        raise ValueError(f"{data_dir} has no version {version}: its versions are {ranges(present_versions(data_dir, latest))}")
    return document


def present_versions(data_dir: str, latest: int) -> list:
    """The versions whose documents are there (beam-etl gc removes old ones), the latest last."""
    return [v for v in range(1, latest) if FileSystems.exists(FileSystems.join(data_dir, version_json(v)))] + [latest]


def ranges(numbers) -> str:
    """[1, 2, 3, 5] -> '1..3, 5'."""
    runs = []
    for n in numbers:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(f"{a}..{b}" if b > a else f"{a}" for a, b in runs)


def is_complete(data_dir: str) -> bool:
    return FileSystems.exists(FileSystems.join(data_dir, DATASET_JSON))


def _files_under(folder: str):
    if not objstore.scheme(folder) and not FileSystems.exists(folder):  # a prefix never "exists"
        return []
    return [m.path for m in FileSystems.match([folder.rstrip("/") + "/**"])[0].metadata_list]


def _move(src: str, dst: str) -> None:
    parent = posixpath.dirname(dst)
    if "://" not in dst and not FileSystems.exists(parent):
        FileSystems.mkdirs(parent)
    FileSystems.rename([src], [dst])


def publish(staging: str, output: str, document: dict, analysis: str) -> None:
    """Move the staged dataset into `output` and write dataset.json last.

    An old dataset in `output` (only with --overwrite) loses its dataset.json first, so at
    no moment does a mix of old and new files look complete.
    """
    old_json = FileSystems.join(output, DATASET_JSON)
    if FileSystems.exists(old_json):
        FileSystems.delete([old_json])
    old = [p for p in _files_under(output) if _SHARD.match(posixpath.basename(p)) and posixpath.dirname(p) == output.rstrip("/")]
    for name in (*TRANSFORM_DIRS, ledger.LEDGER_DIR):
        old += _files_under(FileSystems.join(output, name))
    if old:
        FileSystems.delete(old)
    for split in document["splits"].values():
        for shard in split["shards"]:
            _move(FileSystems.join(staging, "shards", shard["file"]), FileSystems.join(output, shard["file"]))
            if shard.get("index"):
                _move(FileSystems.join(staging, "shards", shard["file"] + ".idx"), FileSystems.join(output, shard["file"] + ".idx"))
    for name in TRANSFORM_DIRS:  # from the publishing worker's local disk (analyze.write_transform)
        base = os.path.join(analysis, name)
        for folder, _, files in os.walk(base):
            for file in files:
                path = os.path.join(folder, file)
                objstore.copy_file(path, FileSystems.join(output, name, *os.path.relpath(path, base).split(os.sep)))
    for name in document.get("ledger", {}).get("files", ()):
        _move(FileSystems.join(staging, name), FileSystems.join(output, name))
    move_rejects(staging, output)
    write_json(FileSystems.join(output, DATASET_JSON), document)


def remove_stale_staging(output: str) -> list:
    """Delete the .staging-* folders that killed runs left in `output`; call after a publish."""
    if "://" not in output:  # local: a killed run may have left only empty folders, which a match skips
        stale = sorted(FileSystems.join(output, n) for n in os.listdir(output) if n.startswith(".staging-"))
    else:
        files = FileSystems.match([output.rstrip("/") + "/.staging-*/**"])[0].metadata_list
        stale = sorted({FileSystems.join(output, m.path[len(output.rstrip("/")) + 1 :].split("/")[0]) for m in files})
    for folder in stale:
        objstore.delete_tree(folder)
    return stale


def move_rejects(staging: str, output: str) -> None:
    src = FileSystems.join(staging, REJECTED_JSONL)
    if FileSystems.exists(src):
        dst = FileSystems.join(output, REJECTED_JSONL)
        if FileSystems.exists(dst):
            FileSystems.delete([dst])
        _move(src, dst)


def shard_paths(data_dir: str, document: dict, split: str):
    return [FileSystems.join(data_dir, s["file"]) for s in document["splits"][split]["shards"]]

