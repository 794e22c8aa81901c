"""`beam-etl compact`: a new version whose small or mostly-dropped generations are rewritten into full-size shards.

Every `convert --update` adds a generation of small shards and excludes old records by
(generation, key) instead of rewriting their shards. Compaction reads the shards of the
generations worth rewriting once (no decode), leaves out their excluded records, and writes
the rest as shards of one new generation; generations that are full-size and mostly live are
kept as they are. The ledger's lines of the moved records name the new generation, so that a
later update excludes the right copy. Published like an update (update.publish_version):
nothing published is rewritten, dataset.json last; `beam-etl gc` then removes what no kept
version names.
"""

import datetime
import gzip
import math
import shutil
import tempfile
import uuid

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_etl import ledger, metadata, objstore, rewrite, sharding, update

MAX_EXCLUDED_FRACTION = 0.1  # a generation with more of its records dropped than this is rewritten


class NotCompactable(ValueError):
    """The dataset cannot be compacted as it is; the message says why and what to do."""


def generation_sizes(document: dict) -> dict:
    """{generation: {"records", "bytes", "shards", "excluded"}} over every split of a version."""
    sizes = {}
    for split in document["splits"].values():
        for shard in split["shards"]:
            g = sizes.setdefault(shard.get("generation", 1), {"records": 0, "bytes": 0, "shards": 0, "excluded": 0})
            g["records"] += shard["examples"]
            g["bytes"] += shard["bytes"]
            g["shards"] += 1
    for generation, _ in document.get("excluded", {}).get("records", ()):
        sizes[generation]["excluded"] += 1
    return sizes


def choose(document: dict, target_bytes: float, max_excluded_fraction: float = MAX_EXCLUDED_FRACTION) -> list:
    """The generations worth rewriting: shards under half the target size on average, or too many records dropped.

    Empty when rewriting would give the same shards back: one small generation alone, with
    nothing dropped, is already as compact as its size allows.
    """
    sizes = generation_sizes(document)
    small = {g for g, s in sizes.items() if s["bytes"] / s["shards"] < target_bytes / 2}
    dropped = {g for g, s in sizes.items() if s["records"] and s["excluded"] / s["records"] > max_excluded_fraction}
    chosen = small | dropped
    return sorted(chosen) if dropped or len(chosen) > 1 else []


def _rewrite_ledger(output: str, document: dict, chosen: set, generation: int, dest: str) -> dict:
    """Every ledger line of the version, the moved records' naming `generation`; returns {split: moved count}."""
    moved, entries = {}, 0
    temp = f"{dest}.{uuid.uuid4().hex}.tmp"
    with FileSystems.create(temp, compression_type=CompressionTypes.GZIP) as out:
        for name in document["ledger"]["files"]:
            with FileSystems.open(FileSystems.join(output, name), compression_type=CompressionTypes.UNCOMPRESSED) as raw, \
                    gzip.open(raw, "rt", encoding="utf-8") as lines:
                batch = []
                for line in lines:
                    entry = ledger.loads(line)
                    entries += 1
                    if entry["outcome"] == ledger.WRITTEN and entry.get("generation", 1) in chosen:
                        entry["generation"] = generation
                        moved[entry["split"]] = moved.get(entry["split"], 0) + 1
                    batch.append(ledger.dumps(entry) + "\n")
                    if len(batch) >= 10_000:
                        out.write("".join(batch).encode("utf-8"))
                        batch = []
                out.write("".join(batch).encode("utf-8"))
    if entries != document["ledger"]["entries"]:
        raise metadata.IncompleteDataset(f"{output}: its ledger has {entries} lines, dataset.json says {document['ledger']['entries']}")
    FileSystems.rename([temp], [dest])
    return moved


def _local_graph(output: str) -> str:
    """The latest version's transform graph, copied to a local folder (publish_version copies it from there)."""
    import os

    work = tempfile.mkdtemp(prefix="beam-etl-compact-")
    for name in metadata.TRANSFORM_DIRS:
        base = FileSystems.join(output, name)
        for path in metadata._files_under(base):
            local = os.path.join(work, name, *path[len(base) + 1:].split("/"))
            os.makedirs(os.path.dirname(local), exist_ok=True)
            objstore.copy_file(path, local)
    return work


def compact(output: str, target_mb: float = 0.0, max_excluded_fraction: float = MAX_EXCLUDED_FRACTION, filesystem_flags=()) -> dict:
    """Publish version N+1 of `output` with its chosen generations rewritten; returns what was done."""
    document = metadata.read(output)
    previous = update.version_of(document)
    if "ledger" not in document:
        raise NotCompactable(f"{output} has no ledger (converted before datasets had one): there is nothing a compaction could keep track of")
    if document["options"].get("compression", "none") != "none":
        raise NotCompactable(f"{output} has {document['options']['compression']} shards, which compact does not rewrite yet")
    target = (target_mb or document["options"].get("shard_size_mb") or 256.0) * 1e6
    chosen = choose(document, target, max_excluded_fraction)
    if not chosen:
        return {"compacted": False, "version": previous}
    generation = previous + 1
    folder = update.generation_dir(generation)
    staging = FileSystems.join(output, f".staging-compact-{uuid.uuid4().hex[:12]}")
    dropped = {(g, key) for g, key in document.get("excluded", {}).get("records", ()) if g in chosen}
    schema_name = document["schema"]
    new = {"splits": {}, "read": 0, "written": 0, "dropped": 0}
    work = None
    try:
        splits, tasks = {}, []  # tasks: (split, file, indexed, old shards)
        for name, split in document["splits"].items():
            old = [s for s in split["shards"] if s.get("generation", 1) in chosen]
            indexed = any(s.get("index") for s in split["shards"])
            groups = rewrite.pack(old, min(max(1, math.ceil(sum(s["bytes"] for s in old) / target)), len(old))) if old else []
            tasks += [(name, sharding.shard_name(name, i, len(groups)), indexed, group) for i, group in enumerate(groups)]
            splits[name] = dict(split, shards=[s for s in split["shards"] if s.get("generation", 1) not in chosen])
        args = []
        for _, file, indexed, group in tasks:
            gens = {s.get("generation", 1) for s in group}
            args.append((output, group, {(g, k) for g, k in dropped if g in gens}, FileSystems.join(staging, "shards", file), f"{file}/{generation}",
                         schema_name, indexed, tuple(filesystem_flags)))
        for (name, file, indexed, group), done in zip(tasks, rewrite.run(args, sum(s["bytes"] for *_, group in tasks for s in group))):
            new["read"] += sum(s["examples"] for s in group)
            new["dropped"] += done["skipped"]
            new["splits"][name] = new["splits"].get(name, 0) + done["examples"]
            new["written"] += done["examples"]
            if not done["examples"]:  # every record of the group was dropped: no empty shard (it goes with the staging)
                continue
            splits[name]["shards"].append({"file": f"{folder}/{file}", "examples": done["examples"], "bytes": done["bytes"], "sha256": done["sha256"],
                                           "generation": generation, **({"index": True} if indexed else {})})
        for split in splits.values():
            split["bytes"] = sum(s["bytes"] for s in split["shards"])
        ledger_name = f"{ledger.LEDGER_DIR}/{folder}/compacted-00000-of-00001{ledger.SUFFIX}"
        moved = _rewrite_ledger(output, document, set(chosen), generation, FileSystems.join(staging, ledger.LEDGER_DIR, ledger_name.rsplit("/", 1)[1]))
        if moved != {k: v for k, v in new["splits"].items() if v}:
            raise metadata.IncompleteDataset(f"the ledger names {moved} live records in generations {chosen}, the rewrite wrote {new['splits']}: nothing published")
        remaining = [[g, key] for g, key in document.get("excluded", {}).get("records", ()) if g not in chosen]
        by_split = dict(document.get("excluded", {}).get("by_split", {}))
        for name, split in splits.items():
            by_split[name] = sum(s["examples"] for s in split["shards"]) - split["examples"]
            if by_split[name] < 0 or (not remaining and by_split[name]):
                raise metadata.IncompleteDataset(f"split {name}: {split['examples']} examples but its shards hold {sum(s['examples'] for s in split['shards'])}")
        compacted = dict(document)
        compacted.pop("update", None)
        compacted.update(
            version=generation,
            created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            splits=splits,
            ledger={"entries": document["ledger"]["entries"], "files": [ledger_name]},
            excluded={"total": len(remaining), "by_split": {k: v for k, v in sorted(by_split.items()) if v}, "records": remaining},
            compacted={"from_version": previous, "generations": chosen, "records_read": new["read"], "records_written": new["written"], "excluded_dropped": new["dropped"]},
            versions=metadata.versions(),
        )
        work = _local_graph(output)
        update.publish_version(staging, output, document, compacted, (work, document["statistics"]))
    finally:
        if work:
            shutil.rmtree(work, ignore_errors=True)
        if _exists(staging):
            objstore.delete_tree(staging)
    metadata.remove_stale_staging(output)
    return {"compacted": True, "version": generation, "generations": chosen, **new}


def _exists(folder: str) -> bool:
    return bool(metadata._files_under(folder)) if objstore.scheme(folder) else FileSystems.exists(folder)
