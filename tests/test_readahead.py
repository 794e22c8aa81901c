"""Reads kept in flight ahead of the decode: order, the bound on reads in flight, errors, and the records they feed."""

import functools
import io
import os
import threading
import time

import pytest

from beam_etl import images, readahead, records, workpool
from beam_etl.sources import ImageRef
from tests.corpus import jpeg


class _Slow:
    """A read that takes `delay` seconds, as an object store's request does; counts how many run at once."""

    def __init__(self, delay=0.01):
        self.delay, self.lock, self.running, self.most = delay, threading.Lock(), 0, 0

    def __call__(self, item):
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        time.sleep(self.delay)
        with self.lock:
            self.running -= 1
        if item == 7:
            raise FileNotFoundError(f"no such object: {item}")
        return item * 10


@pytest.mark.parametrize("depth", [1, 2, 8])
def test_reads_come_back_in_input_order_with_at_most_depth_in_flight(depth):
    read = _Slow()
    reads = readahead.ReadAhead(read, depth)
    out = []
    for i in range(40):
        out.extend(reads.put(i))
        assert len(reads.pending) <= depth  # bounded: put() waits on the oldest beyond depth
    out.extend(reads.drain())
    assert [item for item, _ in out] == list(range(40))
    assert [f.result() for item, f in out if item != 7] == [i * 10 for i in range(40) if i != 7]
    assert read.most <= depth
    if depth > 1:
        assert read.most > 1  # the reads did overlap


def test_a_failed_read_reaches_the_caller_with_its_item():
    out = list(readahead.each(_Slow(0.0), range(10), 4))
    failed = dict(out)[7]
    with pytest.raises(FileNotFoundError, match="no such object: 7"):
        failed.result()


def _refs(tmp_path, n):
    refs = []
    for i in range(n):
        path = tmp_path / f"{i}.jpg"
        path.write_bytes(b"\xff\xd8\xff\xe0 truncated" if i == 3 else jpeg(seed=i))
        refs.append(ImageRef(f"cat/{i}.jpg", str(path), "cat", "train", path.stat().st_size))
    refs.append(ImageRef("cat/gone.jpg", str(tmp_path / "gone.jpg"), "cat", "train", -1))
    refs.append(ImageRef("dog/0.jpg", str(tmp_path / "0.jpg"), "dog", "train", -1))  # not in the label set
    return refs


def test_convert_chunk_with_reads_ahead_equals_one_at_a_time(tmp_path):
    refs = _refs(tmp_path, 12)
    settings = records.Settings(images.Policy(), {"cat": 0}, reads_in_flight=1)
    one_at_a_time = records.convert_chunk(refs, settings)
    ahead = records.convert_chunk(refs, records.Settings(images.Policy(), {"cat": 0}, reads_in_flight=6))
    assert [(r and r[1], reject) for r, reject in ahead] == [(r and r[1], reject) for r, reject in one_at_a_time]
    reasons = [reject[0] if reject else None for _, reject in ahead]
    assert reasons[3] is not None and reasons[-2] == images.UNREADABLE and reasons[-1] == images.UNKNOWN_LABEL
    assert reasons.count(None) == 11


def test_the_pool_runs_whole_chunks_with_reads_ahead(tmp_path):
    refs = _refs(tmp_path, 12)
    settings = records.Settings(images.Policy(), {"cat": 0}, reads_in_flight=4)
    pool = workpool.OrderedMap(2, functools.partial(records.convert_chunk, settings=settings), chunk_size=5, per_chunk=True)
    out = [done for ref in refs for done in pool.put(ref)] + list(pool.drain())
    assert [ref for ref, _ in out] == refs
    assert [outcome for _, outcome in out] == records.convert_chunk(refs, settings)


def test_stage_chunk_writes_what_convert_chunk_returns_and_bounds_what_it_holds(tmp_path, monkeypatch):
    """The pool's staging: the same outcomes without payloads, the records in chunks, a chunk per STAGE_MEMORY_BYTES."""
    from beam_etl import chunks, tfrecord

    refs = _refs(tmp_path, 12)
    settings = records.Settings(images.Policy(), {"cat": 0}, reads_in_flight=3)
    returned = records.convert_chunk(refs, settings)
    sizes = sorted(len(tfrecord.frame(r[1])) for r, _ in returned if r)
    monkeypatch.setattr(records, "STAGE_MEMORY_BYTES", sum(sizes[-4:]))  # about a third of them per chunk
    staged = records.stage_chunk(refs, settings, str(tmp_path / "chunks"))
    assert [(r and (r[0], r[2]), reject) for r, reject, _ in staged] == [(r and (r[0], r[2]), reject) for r, reject in returned]
    assert all(r is None or r[1] is None for r, _, _ in staged)  # no Example bytes come back
    described = [d for _, _, done in staged for d in done]
    assert 3 <= len(described) <= 5 and {split for split, _ in described} == {"train"}
    stored = []
    for _, (path, n, nbytes) in described:
        offsets = chunks.read_index(path, n, nbytes)  # each chunk carries its index
        with open(path, "rb") as f:
            stored += [r for _, _, r in tfrecord.iter_framed(io.BytesIO(f.read(nbytes)), path)]
        assert len(offsets) == n + 1
    assert sorted(stored) == sorted(r[1] for r, _ in returned if r)
    assert sorted(os.listdir(tmp_path / "chunks")) == sorted(os.path.basename(p) for _, (p, _, _) in described)
