"""Staged chunks: one bundle's records of a split, in spread order, followed by an index of their offsets.

A chunk is written where its records were made and read back by the shard writers, a byte
range per shard (sharding.plan). Its records are stored in spread order (bit-reversed arrival
order), so that any run of it samples the whole bundle evenly: a runner that delivers a bundle
one class after another (the DirectRunner reads folders in order) still gives every shard
every class, and a shard reads each chunk in one range instead of a record at a time.
"""

import os
import tempfile

import numpy as np

from beam_etl import objstore, tfrecord

MAX_CHUNK_BYTES = 256 << 20  # a bundle's split rolls over to a new chunk here: bounds the local temp file


def spread_order(n: int) -> np.ndarray:
    """Positions 0..n-1 sorted by their bit-reversed value: every run of k samples the range about every n/k."""
    if n <= 1:
        return np.arange(n, dtype=np.int64)
    bits = (n - 1).bit_length()
    j = np.arange(n, dtype=np.uint64)
    reversed_ = np.zeros(n, dtype=np.uint64)
    for b in range(bits):
        reversed_ |= ((j >> np.uint64(b)) & np.uint64(1)) << np.uint64(bits - 1 - b)
    return np.argsort(reversed_, kind="stable").astype(np.int64)


def read_index(path: str, examples: int, nbytes: int) -> np.ndarray:
    """A chunk's record offsets plus its end (examples + 1 little-endian int64), stored after its records.

    One ranged read: the descriptor carries where the records end. In the file, not beside it,
    so that a chunk costs the store one object to write and one request to index.
    """
    data = objstore.read_range(path, nbytes, nbytes + 8 * (examples + 1))
    offsets = np.frombuffer(data, dtype="<i8")
    if len(offsets) != examples + 1 or offsets[0] != 0 or offsets[-1] != nbytes:
        raise tfrecord.CorruptRecord(f"{path}: its index does not list {examples} records ending at byte {nbytes}; "
                                     "the chunk was changed or cut short after it was staged")
    return offsets


def index_bytes(offsets) -> bytes:
    return np.asarray(offsets, dtype="<i8").tobytes()


def _store(dest: str, sizes, record) -> None:
    """Write records 0..n-1 (record(j) gives the j-th) to `dest` in spread order, then their index."""
    order = spread_order(len(sizes))
    with objstore.create(dest) as out:
        pending, pending_bytes = [], 0
        for j in order:  # batched into ~8 MB writes: one call per record costs on a bucket
            pending.append(record(j))
            pending_bytes += int(sizes[j])
            if pending_bytes >= 8 << 20:
                out.write(b"".join(pending))
                pending, pending_bytes = [], 0
        out.write(b"".join(pending))
        out.write(index_bytes(np.concatenate([[0], np.cumsum(np.asarray(sizes, dtype=np.int64)[order])])))


def write_chunk(dest: str, framed: list) -> tuple:
    """Framed records held in memory to a chunk at `dest`, in spread order; returns (path, examples, bytes)."""
    sizes = np.fromiter((len(r) for r in framed), dtype=np.int64, count=len(framed))
    if not objstore.scheme(dest):  # two processes may make the folder at once
        os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
    _store(dest, sizes, lambda j: framed[j])
    return dest, len(framed), int(sizes.sum())


class ChunkWriter:
    """Collects framed records in a local temporary file; publish() stores them at `dest` in spread order.

    The local file is the one extra copy: the spread order needs the record count, and the
    store is then written once, sequentially. Memory holds offsets only.
    """

    def __init__(self, dest: str):
        if objstore.scheme(dest):  # a bucket: the worker's own disk
            fd, self.temp = tempfile.mkstemp(prefix="beam-etl-chunk-", suffix=".tfrecord")
        else:  # beside the chunk, where progress and the benches see records arrive
            os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
            self.temp = dest + ".partial"
            fd = os.open(self.temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.file = os.fdopen(fd, "wb")
        self.dest = dest
        self.offsets = [0]

    @property
    def records(self) -> int:
        return len(self.offsets) - 1

    @property
    def nbytes(self) -> int:
        return self.offsets[-1]

    def add(self, framed: bytes) -> None:
        self.file.write(framed)
        self.offsets.append(self.offsets[-1] + len(framed))

    def publish(self) -> tuple:
        """Write the chunk, then its index, to the store; returns (path, examples, bytes of records)."""
        self.file.close()
        offsets = np.asarray(self.offsets, dtype=np.int64)
        sizes = np.diff(offsets)
        try:
            with open(self.temp, "rb") as src:
                fd = src.fileno()
                _store(self.dest, sizes, lambda j: os.pread(fd, int(sizes[j]), int(offsets[j])))
        finally:
            os.unlink(self.temp)
        return self.dest, self.records, self.nbytes

    def discard(self) -> None:
        """Drop the local file (a failed bundle: its chunk is never published or read)."""
        self.file.close()
        if os.path.exists(self.temp):
            os.unlink(self.temp)
