"""Shard counts, names and the plan that cuts staged chunks into balanced shards."""

import hashlib
import math
import random
import uuid

import numpy as np

from apache_beam.io.filesystems import CompressionTypes, FileSystems

from beam_etl import localio, tfrecord


def parse_num_shards(text):
    """'64' -> 64 for every split; 'train=64,validation=8' -> a dict; None/'' -> None."""
    if text in (None, ""):
        return None
    text = str(text).strip()
    if text.isdigit():
        if int(text) < 1:
            raise ValueError(f"--num_shards must be at least 1, got {text!r}")
        return int(text)
    counts = {}
    for part in text.split(","):
        split, _, number = part.partition("=")
        if not number.strip().isdigit() or int(number) < 1:
            raise ValueError(f"--num_shards: bad part {part!r}; write 64 or train=64,validation=8")
        counts[split.strip()] = int(number)
    return counts


def shard_count(split: str, examples: int, nbytes: int, num_shards, shard_size_mb: float) -> int:
    """How many shards a split gets: the count asked for, or enough to keep shards near the size."""
    if isinstance(num_shards, int):
        wanted = num_shards
    elif isinstance(num_shards, dict) and split in num_shards:
        wanted = num_shards[split]
    else:
        wanted = max(1, math.ceil(nbytes / (shard_size_mb * 1e6)))
    return max(1, min(wanted, examples))  # never an empty shard


def suffix(compression: str) -> str:
    return ".tfrecord.gz" if compression == "gzip" else ".tfrecord"


def shard_name(split: str, index: int, count: int, compression: str = "none") -> str:
    return f"{split}-{index:05d}-of-{count:05d}{suffix(compression)}"


def order(chunks):
    """Chunks [(path, examples)] in the one order every worker agrees on, with each one's first global index."""
    out, first = [], 0
    for path, n in sorted(chunks):
        if n:
            out.append((path, first, n))
            first += n
    return out


def shard_size(total: int, index: int, count: int) -> int:
    """How many records shard `index` gets when every count-th record goes to it."""
    return (total - index + count - 1) // count


def read_index(path: str):
    """A chunk's record offsets, written beside it as little-endian int64."""
    with FileSystems.open(path + ".idx", compression_type=CompressionTypes.UNCOMPRESSED) as f:
        return np.frombuffer(f.read(), dtype="<i8")


def write_index(path: str, offsets) -> None:
    with FileSystems.create(path + ".idx", compression_type=CompressionTypes.UNCOMPRESSED) as f:
        f.write(np.asarray(offsets, dtype="<i8").tobytes())


def locate(chunks, index: int, count: int):
    """Where the records of shard `index` are: [(chunk path, offset)], every count-th record of the ordered chunks.

    Striding makes every shard a stratified sample of the whole split, whatever order the
    runner delivered records in (one class per input folder, say), and balances the
    counts to within one record. Only offsets: nothing of the payloads is read.
    """
    places = []
    for path, first, n in order(chunks):
        offsets = read_index(path)
        if len(offsets) != n:
            raise tfrecord.CorruptRecord(f"{path}: index lists {len(offsets)} records, expected {n}")
        places.extend((path, int(offsets[j])) for j in range((index - first) % count, n, count))
    return places


class _Reader:
    """Reads framed records at (chunk, offset), CRCs checked, with a few chunk files kept open."""

    def __init__(self, keep_open: int = 32):
        self.files, self.keep_open = {}, keep_open  # path -> open file, oldest first

    def framed(self, path: str, offset: int) -> bytes:
        f = self.files.pop(path, None)
        if f is None:
            if len(self.files) >= self.keep_open:
                self.files.pop(next(iter(self.files))).close()
            f = FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
        self.files[path] = f  # now the most recent
        f.seek(offset)
        return tfrecord.read_framed(f, path, offset)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for f in self.files.values():
            f.close()
        self.files = {}


def write_shard(chunks, index: int, count: int, dest: str, compression: str = "none", seed: str = "", keep=None):
    """Write shard `index` of `count` to `dest`; return (examples, bytes, sha256).

    The records are shuffled within the shard (seeded, so a retry writes the same file) by
    shuffling their offsets, then copied one at a time: memory holds offsets, not payloads,
    so it does not grow with the shard size. (The chunks were just written, so on a local
    disk the reads come from the page cache.) `keep(record)` drops records it is false for
    (removed duplicates). The caller writes to a temporary name and renames. An uncompressed
    local shard is written with O_DIRECT (localio: the page cache costs more than the disk).
    """
    places = locate(chunks, index, count)
    random.Random(f"{seed}/{index}/{count}").shuffle(places)
    ctype = CompressionTypes.GZIP if compression == "gzip" else CompressionTypes.UNCOMPRESSED
    digest, nbytes, examples = hashlib.sha256(), 0, 0
    if compression == "none" and localio.is_local(dest):
        output = localio.DirectWriter(dest)
    else:
        output = FileSystems.create(dest, mime_type="application/octet-stream", compression_type=ctype)
    with _Reader() as reader, output as out:
        for path, offset in places:
            record = reader.framed(path, offset)
            if keep is not None and not keep(record[12:-4]):
                continue
            out.write(record)
            examples += 1
            nbytes += len(record)
            digest.update(record)
    if compression == "gzip":
        return examples, *file_digest(dest)  # the digest is of the stored, compressed bytes
    return examples, nbytes, digest.hexdigest()


def write_task(task, shard_dir: str, compression: str = "none", index: bool = False, schema_name: str = "default", dropped=(),
               filesystem_flags=()) -> dict:
    """Write one planned shard (split, index, count, chunks) to shard_dir, atomically; returns its description.

    dropped: keys of removed duplicates (--dedup) to leave out; index: a DALI index beside it;
    filesystem_flags: the Beam flags a pool process needs for a bucket (S3's endpoint and keys).
    """
    from beam_etl import objstore, records

    objstore.configure_for(shard_dir, filesystem_flags)  # once per process

    split, number, count, chunks = task
    name = shard_name(split, number, count, compression)
    final = FileSystems.join(shard_dir, name)
    temp = FileSystems.join(shard_dir, f".{name}.{uuid.uuid4().hex}.tmp")
    keep = None
    if dropped:  # few, so a set per task is cheap
        dropped = set(dropped)
        keep = lambda record: records.key_of(record, schema_name) not in dropped  # noqa: E731
    examples, nbytes, digest = write_shard(chunks, number, count, temp, compression, seed=split, keep=keep)
    if index:  # from the temp file, before the rename makes the shard visible
        from beam_etl.index import index_name, write_index

        write_index(temp, FileSystems.join(shard_dir, index_name(name)), check=False)
    if FileSystems.exists(final):  # a retried task: the first copy has the same records
        FileSystems.delete([final])
    FileSystems.rename([temp], [final])
    return {"split": split, "file": name, "index": number, "count": count, "examples": examples, "bytes": nbytes, "sha256": digest, "indexed": index}


def file_digest(path: str):
    """(bytes, sha256) of a file as stored."""
    digest, size = hashlib.sha256(), 0
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        while True:
            block = f.read(1 << 20)
            if not block:
                return size, digest.hexdigest()
            size += len(block)
            digest.update(block)
