"""Shard counts, names, the plan that cuts staged chunks into balanced shards, and the shard writer."""

import hashlib
import math
import random
import uuid

import numpy as np

from beam_etl import localio, objstore, tfrecord
from beam_etl.chunks import read_index


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


def shard_start(total: int, index: int, count: int) -> int:
    """Where shard `index` of `count` starts in the split's run of `total` records: ceil(index * total / count)."""
    return -(-index * total // count)


def shard_size(total: int, index: int, count: int) -> int:
    """How many records shard `index` gets: runs that differ by at most one, the longer ones first."""
    return shard_start(total, index + 1, count) - shard_start(total, index, count)


MAX_CHUNKS_PER_GROUP = 64  # a shard reads from the chunks of one group (two at its edges)


def groups(chunks):
    """Chunks [(path, examples, bytes)] in the order every worker agrees on, dealt into groups of at most 64.

    Dealt by stride over the paths (random names), so each group samples the whole split.
    Without groups every shard would read a range of every chunk: shards x chunks requests.
    """
    ordered = [c for c in sorted(chunks) if c[1]]
    count = max(1, math.ceil(len(ordered) / MAX_CHUNKS_PER_GROUP))
    return [ordered[r::count] for r in range(count) if ordered[r::count]]


def merged_positions(sizes):
    """Where each chunk's records fall when chunks of these sizes are merged evenly, each in its order.

    Record k of a chunk of n sits at (k + 0.5) / n of the merged run (ties: the earlier chunk
    first), so any stretch of the run takes from every chunk in proportion to its size.
    """
    keys = np.concatenate([(np.arange(n) + 0.5) / n for n in sizes])
    rank = np.empty(len(keys), dtype=np.int64)
    rank[np.argsort(keys, kind="stable")] = np.arange(len(keys))
    starts = np.cumsum([0, *sizes])
    return [rank[starts[c]:starts[c + 1]] for c in range(len(sizes))]


def plan(chunks, count: int, reads_in_flight: int = 16):
    """Yield (shard index, [(chunk path, start byte, end byte, examples)]) for each of `count` shards.

    The split is one run: the groups one after another, each group its chunks merged evenly.
    Shard i takes the stretch [ceil(i*N/count), ceil((i+1)*N/count)) of that run: balanced to within one
    record, and from each chunk of its group one contiguous range of the chunk's (spread)
    order, which is one range of bytes. Only offsets are read here: one index per chunk.
    """
    from concurrent.futures import ThreadPoolExecutor

    total = sum(n for _, n, _ in chunks)
    bounds = [shard_start(total, i, count) for i in range(count + 1)]
    shard, ranges, base = 0, [], 0
    with ThreadPoolExecutor(reads_in_flight) as pool:
        for group in groups(chunks):
            sizes = [n for _, n, _ in group]
            indexes = list(pool.map(lambda chunk: read_index(*chunk), group))
            positions, size, low = merged_positions(sizes), sum(sizes), 0
            while shard < count:
                high = min(bounds[shard + 1] - base, size)
                for (path, _, _), where, offsets in zip(group, positions, indexes):
                    a, b = np.searchsorted(where, low), np.searchsorted(where, high)
                    if b > a:
                        ranges.append((path, int(offsets[a]), int(offsets[b]), int(b - a)))
                low = high
                if bounds[shard + 1] - base > size:
                    break  # the shard goes on in the next group
                yield shard, ranges
                shard, ranges = shard + 1, []
            base += size


READ_BUDGET = 128 << 20  # bytes of read blocks held per shard writer, over all its ranges
SHUFFLE_BUFFER = 32 << 20  # bytes of records a shard writer shuffles among


class _RangeReader:
    """The framed records in bytes [start, end) of a chunk, fetched a block at a time, CRCs checked."""

    def __init__(self, path: str, start: int, end: int, examples: int, block: int):
        self.path, self.end, self.left, self.block = path, end, examples, block
        self.buffer, self.at, self.offset = b"", 0, start  # offset: the chunk's byte at buffer[at]

    def _have(self, wanted: int) -> None:
        held = len(self.buffer) - self.at
        if held >= wanted:
            return
        begin = self.offset + held
        stop = min(self.end, begin + max(self.block, wanted - held))
        data = objstore.read_range(self.path, begin, stop) if stop > begin else b""
        if held + len(data) < wanted:
            raise tfrecord.CorruptRecord(f"{self.path}: truncated record at byte {self.offset} (the range ends at {self.end})")
        self.buffer, self.at = self.buffer[self.at:] + data, 0

    def next(self) -> bytes:
        if self.left <= 0:
            raise tfrecord.CorruptRecord(f"{self.path}: more records asked of bytes ..{self.end} than the index lists")
        self._have(12)
        length = tfrecord.record_length(self.buffer[self.at:self.at + 12], self.path, self.offset)
        self._have(length + 16)
        framed = self.buffer[self.at:self.at + length + 16]
        tfrecord.check_framed(framed, self.path, self.offset)
        self.at, self.offset, self.left = self.at + len(framed), self.offset + len(framed), self.left - 1
        return framed

    def check_done(self) -> None:
        if self.offset != self.end:
            raise tfrecord.CorruptRecord(f"{self.path}: its records end at byte {self.offset}, its index says {self.end}")


def _shuffled(records, rng: random.Random, capacity: int, size_of=len):
    """The records in a random order, holding at most `capacity` bytes of them (a shuffle buffer)."""
    held, size = [], 0
    for record in records:
        held.append(record)
        size += size_of(record)
        while size > capacity and held:
            i = rng.randrange(len(held))
            held[i], held[-1] = held[-1], held[i]
            out = held.pop()
            size -= size_of(out)
            yield out
    rng.shuffle(held)
    yield from held


def _merged(ranges, seed: str):
    """(range index, record) of every range's records, the ranges interleaved at random (each in its own order)."""
    block = int(min(16 << 20, max(1 << 20, READ_BUDGET // max(1, len(ranges)))))
    readers = [_RangeReader(path, start, end, n, block) for path, start, end, n in ranges]
    picks = np.repeat(np.arange(len(ranges), dtype=np.int64), [n for *_, n in ranges])
    np.random.default_rng(int.from_bytes(hashlib.sha256(seed.encode()).digest()[:8], "little")).shuffle(picks)
    for pick in picks:
        yield pick, readers[pick].next()
    for reader in readers:
        reader.check_done()


def write_shard(ranges, index: int, count: int, dest: str, compression: str = "none", seed: str = "", keep=None):
    """Write shard `index` of `count` from its planned byte ranges to `dest`; return (examples, bytes, sha256).

    Each range is read in blocks of megabytes (one request each on a bucket), the ranges
    interleaved at random and then shuffled in a 32 MB buffer, seeded, so that a retry writes
    the same file. Memory holds the read blocks and the buffer, whatever the shard's size.
    `keep(record, range)` drops records it is false for (removed duplicates, a compaction's
    excluded records): the record's bytes and the range it came from. The caller writes to a
    temporary name and renames. An uncompressed local shard is written with O_DIRECT
    (localio: the page cache costs more than the disk).
    """
    seed = f"{seed}/{index}/{count}"
    digest, nbytes, examples = hashlib.sha256(), 0, 0
    if compression == "none" and localio.is_local(dest):
        output = localio.DirectWriter(dest)
    else:
        output = objstore.create(dest, gzip=compression == "gzip")
    with output as out:
        for pick, record in _shuffled(_merged(ranges, seed), random.Random(seed), SHUFFLE_BUFFER, lambda item: len(item[1])):
            if keep is not None and not keep(record[12:-4], ranges[pick]):
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
    """Write one planned shard (split, index, count, ranges) to shard_dir, atomically; returns its description.

    dropped: keys of removed duplicates (--dedup) to leave out; index: a DALI index beside it;
    filesystem_flags: the Beam flags a pool process needs for a bucket (S3's endpoint and keys).
    """
    from beam_etl import objstore, records

    objstore.configure_for(shard_dir, filesystem_flags)  # once per process

    split, number, count, ranges = task
    name = shard_name(split, number, count, compression)
    final = objstore.join(shard_dir, name)
    temp = objstore.join(shard_dir, f".{name}.{uuid.uuid4().hex}.tmp")
    keep = None
    if dropped:  # few, so a set per task is cheap
        dropped = set(dropped)
        keep = lambda record, _: records.key_of(record, schema_name) not in dropped  # noqa: E731
    examples, nbytes, digest = write_shard(ranges, number, count, temp, compression, seed=split, keep=keep)
    if index:  # from the temp file, before the rename makes the shard visible
        from beam_etl.index import index_name, write_index

        write_index(temp, objstore.join(shard_dir, index_name(name)), check=False)
    # A retried task finds its first copy in place, with the same records: the rename replaces it
    # (os.rename; copy-then-delete on gs:// and s3://), so no existence check costs a request.
    objstore.rename(temp, final)
    return {"split": split, "file": name, "index": number, "count": count, "examples": examples, "bytes": nbytes, "sha256": digest, "indexed": index}


def file_digest(path: str):
    """(bytes, sha256) of a file as stored."""
    digest, size = hashlib.sha256(), 0
    with objstore.open_read(path) as f:
        while True:
            block = f.read(1 << 20)
            if not block:
                return size, digest.hexdigest()
            size += len(block)
            digest.update(block)
