"""Inputs (folders, globs, CSV/JSONL manifests) turned into image references. Beam FileSystems only."""

import csv
import dataclasses
import hashlib
import io
import json
import os
import posixpath
import re
import typing

from beam_etl import objstore

SPLITS = ("train", "validation", "test")
_SPLIT_ALIASES = {"train": "train", "training": "train", "validation": "validation", "val": "validation", "valid": "validation", "test": "test"}
_GLOB_CHARS = re.compile(r"[*?\[]")


class InputError(ValueError):
    """A bad --input or manifest row; the message names the value and what to do."""


class ImageRef(typing.NamedTuple):
    """One input image: a stable key (relative to its input root), where it is, its label and split."""

    key: str
    uri: str
    label: str  # "" when the input gave none
    split: str  # "" when the input gave none; assigned from fractions later
    size: int  # bytes, -1 when unknown
    mtime: typing.Optional[float] = None  # as listed (a bucket: the object's update time); None when unknown


@dataclasses.dataclass(frozen=True)
class Source:
    """One --input: a folder tree, a glob or a manifest."""

    kind: str  # "folder", "glob" or "manifest"
    uri: str

    @property
    def root(self) -> str:
        """The folder that keys are relative to."""
        if self.kind == "folder":
            return self.uri.rstrip("/")
        if self.kind == "glob":
            return posixpath.dirname(_GLOB_CHARS.split(self.uri, 1)[0])
        return posixpath.dirname(self.uri)

    @property
    def pattern(self) -> str:
        return self.uri.rstrip("/") + "/**" if self.kind == "folder" else self.uri


def normalise_split(name: str) -> str:
    """A split name in canonical spelling, or '' when it is no split name."""
    return _SPLIT_ALIASES.get(name.strip().lower(), "")


def classify(uri: str) -> Source:
    """Tell what kind of input a --input value is."""
    lower = uri.lower()
    if lower.endswith((".csv", ".jsonl")):
        return Source("manifest", uri)
    if _GLOB_CHARS.search(uri):
        return Source("glob", uri)
    return Source("folder", uri)


def is_hidden(relpath: str) -> bool:
    """Dotfiles and dot-folders (.DS_Store, .git/) are not inputs."""
    return any(part.startswith(".") for part in relpath.split("/"))


def ref_from_path(source: Source, path: str, size: int, mtime: typing.Optional[float] = None) -> ImageRef:
    """The reference for one listed file: label and split from where it sits."""
    rel = path[len(source.root) :].lstrip("/")
    parts = rel.split("/")
    if source.kind == "glob":
        label = posixpath.basename(posixpath.dirname(path))
        return ImageRef(rel, path, label, "", size, mtime)
    # Folder tree: ROOT/<label>/**/<file>, or ROOT/<split>/<label>/**/<file>.
    if normalise_split(parts[0]) and len(parts) >= 2:
        label = parts[1] if len(parts) >= 3 else ""  # a file right under a split folder has no label
        return ImageRef(rel, path, label, normalise_split(parts[0]), size, mtime)
    if len(parts) >= 2:
        return ImageRef(rel, path, parts[0], "", size, mtime)
    return ImageRef(rel, path, "", "", size, mtime)


def list_source(source: Source):
    """Yield an ImageRef for each file of a folder or glob source."""
    for result in objstore.filesystems().match([source.pattern]):
        for meta in result.metadata_list:
            if is_folder_marker(meta.path):
                continue
            ref = ref_from_path(source, meta.path, meta.size_in_bytes, meta.last_updated_in_seconds)
            if not is_hidden(ref.key):
                yield ref, ref.mtime


def _resolve(manifest_uri: str, path: str) -> str:
    if "://" in path or path.startswith("/"):
        return path
    return objstore.join(posixpath.dirname(manifest_uri), path)


def parse_manifest(uri: str, lines: typing.Iterable[str]):
    """Yield an ImageRef for each row of a CSV or JSONL manifest; InputError on a bad row."""
    if uri.lower().endswith(".jsonl"):
        rows = _jsonl_rows(uri, lines)
    else:
        rows = _csv_rows(uri, lines)
    for line_no, path, label, split in rows:
        if not path or not label:
            raise InputError(f"{uri}:{line_no}: a row needs a path and a label, got path={path!r} label={label!r}")
        canonical = normalise_split(split) if split else ""
        if split and not canonical:
            raise InputError(f"{uri}:{line_no}: unknown split {split!r}; use one of {', '.join(SPLITS)} or leave it empty")
        yield ImageRef(path, _resolve(uri, path), label, canonical, -1)


def _csv_rows(uri, lines):
    reader = csv.reader(lines)
    for line_no, row in enumerate(reader, start=1):
        if not row or all(not cell.strip() for cell in row):
            continue
        cells = [cell.strip() for cell in row]
        if line_no == 1 and cells[0].lower() == "path":
            continue  # header
        if len(cells) not in (2, 3):
            raise InputError(f"{uri}:{line_no}: expected path,label[,split], got {len(cells)} columns: {row!r}")
        yield line_no, cells[0], cells[1], cells[2] if len(cells) == 3 else ""


def _jsonl_rows(uri, lines):
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{uri}:{line_no}: not JSON ({e.msg}): {line.strip()[:80]!r}") from None
        if not isinstance(row, dict):
            raise InputError(f"{uri}:{line_no}: expected an object with path and label, got {line.strip()[:80]!r}")
        yield line_no, str(row.get("path", "")).strip(), str(row.get("label", "")).strip(), str(row.get("split", "") or "").strip()


def read_manifest(uri: str):
    """Yield the ImageRefs of a manifest, streaming it through Beam's FileSystems."""
    with objstore.filesystems().open(uri) as raw:
        yield from parse_manifest(uri, io.TextIOWrapper(raw, encoding="utf-8", newline=""))


def check_inputs(uris: typing.Sequence[str], labels: typing.Optional[typing.Sequence[str]] = None) -> int:
    """Fail fast, before any pipeline starts, on a missing or empty input or a bad manifest.

    Returns the inputs seen on the way: manifest rows, and files listed, at most _CHECK_LIMIT
    per folder or glob, so a lower bound of the job's size.
    """
    if not uris:
        raise InputError("no --input given; pass a folder, a glob or a .csv/.jsonl manifest")
    seen = 0
    for uri in uris:
        source = classify(uri)
        try:
            objstore.check_bucket(uri)  # a missing bucket or no access, said as such
            with objstore.explained(uri):
                if source.kind == "manifest":
                    seen += _check_manifest(uri, labels)
                else:
                    seen += _check_has_images(source)
        except objstore.StorageError as e:
            raise InputError(str(e)) from None
    return seen


def _check_manifest(uri: str, labels) -> int:
    if not objstore.filesystems().exists(uri):
        raise InputError(f"--input {uri}: manifest not found")
    count = 0
    for ref in read_manifest(uri):
        count += 1
        if labels is not None and ref.label not in labels:
            raise InputError(f"--input {uri}: row {ref.key!r} has label {ref.label!r}, which is not in --labels")
    if not count:
        raise InputError(f"--input {uri}: the manifest has no rows")
    return count


# The early check lists at most this many files looking for one that may be an image. Past it
# the run goes ahead: whatever is not an image becomes a reject with its reason.
_CHECK_LIMIT = 10_000


def _check_has_images(source: Source) -> int:
    """A folder, prefix or glob that holds at least one file that may be an image; returns the files listed."""
    from beam_etl.images import may_be_image_name  # images is Pillow-only; no cycle

    uri = source.uri
    if source.kind == "folder" and not objstore.scheme(uri) and not objstore.filesystems().exists(uri):
        raise InputError(f"--input {uri}: no such folder")
    listed = objstore.filesystems().match([source.pattern], limits=[_CHECK_LIMIT])[0].metadata_list
    files = [m.path for m in listed if not is_folder_marker(m.path) and not is_hidden(ref_from_path(source, m.path, 0).key)]
    if any(may_be_image_name(path) for path in files):
        return len(files)
    where = "no files match it" if source.kind == "glob" else "no files found under it"
    if objstore.scheme(uri) and source.kind == "folder":
        where = "nothing under this prefix (object stores have no folders: a prefix exists only while it holds objects)"
    if listed and not files:
        raise InputError(f"--input {uri}: only hidden files or folder markers under it ({len(listed)}); check the path")
    if not files:
        raise InputError(f"--input {uri}: {where}; check the path")
    if len(listed) < _CHECK_LIMIT:
        raise InputError(
            f"--input {uri}: no images under it: {len(files)} files, none named as an image (first: {files[0]}); "
            "point --input at the images, or list them in a .csv/.jsonl manifest"
        )
    return len(files)  # none of the first _CHECK_LIMIT is named as an image: the encode judges them


def is_folder_marker(path: str) -> bool:
    """A zero-byte "folder/" object that consoles and tools create in buckets: no input."""
    return path.endswith("/")


def assign_split(key: str, validation_fraction: float, test_fraction: float) -> str:
    """A split from a stable hash of the key, so a record keeps its split across runs."""
    bucket = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") / 2.0**64
    if bucket < test_fraction:
        return "test"
    if bucket < test_fraction + validation_fraction:
        return "validation"
    return "train"


def listing(uri: str):
    """Yield (ImageRef, mtime or None) for each file one --input names."""
    source = classify(uri)
    if source.kind == "manifest":
        for ref in with_metadata(read_manifest(uri)):  # before any read: a later change then shows as one
            yield ref, ref.mtime
    else:
        yield from list_source(source)


METADATA_REQUESTS_IN_FLIGHT = 16
_BLOCK = 256


def with_metadata(refs):
    """Manifest rows' references with the size and mtime of their files, in order.

    A folder's listing has them already; a manifest names only paths. The ledger (ledger.py)
    records them at conversion, so that an update compares them without reading the images:
    a stat on local disk, one metadata request per object in a bucket (16 in flight).
    A file that is not there keeps them unknown; its read then rejects it with the reason.
    """
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(METADATA_REQUESTS_IN_FLIGHT) as pool:
        block = []
        for ref in refs:
            if "://" not in ref.uri and not block:  # a local stat is a few µs: a thread would cost 10 times that
                yield _with_metadata(ref)
                continue
            block.append(ref)
            if len(block) >= _BLOCK:
                yield from pool.map(_with_metadata, block)
                block = []
        yield from pool.map(_with_metadata, block)


def _with_metadata(ref: ImageRef) -> ImageRef:
    if ref.mtime is not None:
        return ref
    if "://" not in ref.uri:
        try:
            st = os.stat(ref.uri)
        except OSError:
            return ref
        return ref._replace(size=st.st_size, mtime=st.st_mtime)
    try:
        matched = objstore.filesystems().match([ref.uri])[0].metadata_list
    except Exception:  # noqa: BLE001 - any store error here: the read says what is wrong, as a reject
        return ref
    meta = next((m for m in matched if m.path == ref.uri), None)
    return ref if meta is None else ref._replace(size=meta.size_in_bytes, mtime=meta.last_updated_in_seconds)


def fingerprint(uris) -> str:
    """The source fingerprint of the inputs, as the pipeline computes it, by streaming their listing."""
    total = 0
    for uri in uris:
        for ref, mtime in listing(uri):
            total = (total + fingerprint_entry(ref.uri, ref.size, mtime)) % (1 << 128)
    return f"{total:032x}"


def fingerprint_entry(uri: str, size: int, mtime) -> int:
    """One listed file's contribution to the source fingerprint, summed order-free."""
    return int.from_bytes(hashlib.sha256(f"{uri}\0{size}\0{mtime}".encode("utf-8")).digest()[:16], "big")


def read_bytes(ref: ImageRef, max_bytes: int) -> bytes:
    """The file's bytes, or Rejected when it is too large or cannot be read."""
    from beam_etl.images import TOO_LARGE, UNREADABLE, Rejected  # images is Pillow-only; no cycle

    if ref.size > max_bytes:
        raise Rejected(TOO_LARGE, f"{ref.size} bytes is over --max_file_mb")
    # read(n) allocates n bytes before it reads: asked for --max_file_mb + 1 (64 MB) per image, 16
    # reading threads held a gigabyte of (untouched) memory between them, which a memory cap counts
    # (workpool.limits). The listed size + 1 is enough, unless the file grew since it was listed.
    first = max_bytes + 1 if ref.size < 0 else min(ref.size, max_bytes) + 1
    try:
        with objstore.open_read(ref.uri) as f:
            data = f.read(first)
            if len(data) == first and first <= max_bytes:
                data += f.read(max_bytes + 1 - first)
    except MemoryError:  # this process's cap, reached by another image's work at the same time: the caller reads again
        raise
    except Exception as e:  # noqa: BLE001 - the boundary of a store's client, after its own retries
        # Each store's client raises its own types (google.api_core's NotFound and Forbidden,
        # botocore's ClientError, OSError): whatever stops this one read makes this input a
        # reject, never a failed job. Only the store's open and read are inside this try.
        raise Rejected(UNREADABLE, f"cannot read: {type(e).__name__}: {_first_line(e)}") from None
    if len(data) > max_bytes:
        raise Rejected(TOO_LARGE, f"over --max_file_mb ({max_bytes} bytes)")
    return data


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else ""


def label_names(uris) -> list:
    """The sorted label names of the inputs: the ImageFolder convention for label ids."""
    names = set()
    for uri in uris:
        source = classify(uri)
        if source.kind == "manifest":
            names.update(ref.label for ref in read_manifest(uri))
        elif source.kind == "folder" and "://" not in uri and os.path.isdir(uri):
            names.update(_local_folder_labels(uri))  # a directory listing, not a file listing
        else:
            names.update(ref.label for ref, _ in list_source(source) if ref.label)
    return sorted(names)


def _local_folder_labels(root: str):
    children = [e for e in os.scandir(root) if e.is_dir() and not e.name.startswith(".")]
    for child in children:
        if normalise_split(child.name):
            yield from (e.name for e in os.scandir(child.path) if e.is_dir() and not e.name.startswith("."))
        else:
            yield child.name
