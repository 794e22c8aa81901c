"""`beam-etl gc --keep N`: remove the files that only versions older than the newest N name.

Only what some dropped version's document names is a candidate: its shards (and their DALI
indexes), its ledger files, its document and its folder under versions/ (graph, rejects).
A file that a kept version also names stays, and nothing else in the folder is touched. Safe
against an update or compaction running at the same time: the version it builds on is the
latest, which is always kept, and it names only files that version names or new ones.
Files go first and each dropped version's document last, so a killed gc leaves versions that
a second gc removes, never files that no document names.
"""

from apache_beam.io.filesystems import FileSystems

from beam_etl import metadata, objstore, update


def named(document: dict) -> set:
    """The files a version's document names, relative to the dataset folder (its own folder under versions/ aside)."""
    files = set()
    for split in document["splits"].values():
        for shard in split["shards"]:
            files.add(shard["file"])
            if shard.get("index"):
                files.add(shard["file"] + ".idx")
    files.update(document.get("ledger", {}).get("files", ()))
    return files


def plan(output: str, keep: int) -> tuple:
    """(kept versions, dropped versions, files to remove relative to output), read from the documents alone."""
    if keep < 1:
        raise ValueError(f"--keep must be 1 or more (the latest version is always kept), got {keep}")
    latest = update.version_of(metadata.read(output))
    present = metadata.present_versions(output, latest)  # an earlier gc may have removed some already
    kept, dropped = present[-keep:], present[:-keep]
    keep_files = set()
    for version in kept:
        keep_files |= named(metadata.read_version(output, version))
    remove = set()
    for version in dropped:
        folder = f"{metadata.VERSIONS_DIR}/{update.generation_dir(version)}"
        remove |= named(metadata.read_version(output, version)) - keep_files
        remove |= {path[len(output.rstrip("/")) + 1:] for path in metadata._files_under(FileSystems.join(output, folder))}
    return kept, dropped, sorted(remove)


def gc(output: str, keep: int) -> dict:
    """Remove what only the dropped versions name, then their documents; returns what was removed."""
    kept, dropped, remove = plan(output, keep)
    paths = [FileSystems.join(output, rel) for rel in remove]
    present = [p for p in paths if FileSystems.exists(p)]  # a killed gc removed some already
    sizes = sum(_size(path) for path in present)
    if present:
        FileSystems.delete(present)
    documents = [FileSystems.join(output, metadata.version_json(v)) for v in dropped]
    if documents:
        FileSystems.delete(documents)
    if not objstore.scheme(output):  # local folders left empty (v00002/, versions/v00001/...)
        _remove_empty_folders(output, [update.generation_dir(v) for v in dropped])
    return {"kept": kept, "dropped": dropped, "files": len(present), "bytes": sizes}


def _size(path: str) -> int:
    return FileSystems.match([path])[0].metadata_list[0].size_in_bytes


def _remove_empty_folders(output: str, folders) -> None:
    import os

    for base in (output, os.path.join(output, metadata.VERSIONS_DIR), os.path.join(output, "ledger")):
        for folder in folders:
            path = os.path.join(base, folder)
            for root, _, _ in os.walk(path, topdown=False) if os.path.isdir(path) else ():  # deepest first
                try:
                    os.rmdir(root)
                except OSError:  # not empty: something kept, or not ours
                    pass
