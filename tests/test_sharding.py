"""Shard counts and names, TFRecord framing, and shards cut from staged chunks."""

import gzip
import hashlib
import io
import os

import numpy as np

import pytest

from beam_etl import chunks, sharding, tfrecord

tf = pytest.importorskip("tensorflow")


def write_records(path, records):
    """A TFRecord file of these records."""
    with open(path, "wb") as f:
        for record in records:
            f.write(tfrecord.frame(record))
    return str(path)


def write_chunk(path, records):
    """A chunk as a test writes it: the records in the order given, then its index (n + 1 offsets)."""
    offsets, position = [0], 0
    with open(path, "wb") as f:
        for record in records:
            framed = tfrecord.frame(record)
            position += len(framed)
            offsets.append(position)
            f.write(framed)
        f.write(chunks.index_bytes(offsets))
    return str(path), len(records), position


def shard(chunk_list, index, count, dest, *args, **kwargs):
    """Plan, then write one shard, as WriteShards does."""
    ranges = dict(sharding.plan(chunk_list, count))[index]
    return sharding.write_shard(ranges, index, count, dest, *args, **kwargs)


def test_parse_num_shards():
    assert sharding.parse_num_shards("64") == 64
    assert sharding.parse_num_shards("train=64, validation=8") == {"train": 64, "validation": 8}
    assert sharding.parse_num_shards(None) is None
    for bad in ["0", "train=", "train=x", "train=0"]:
        with pytest.raises(ValueError, match="num_shards"):
            sharding.parse_num_shards(bad)


def test_shard_count():
    assert sharding.shard_count("train", 1000, 2_600_000_000, None, 256) == 11
    assert sharding.shard_count("train", 1000, 10, None, 256) == 1
    assert sharding.shard_count("validation", 1000, 10, {"train": 64}, 256) == 1
    assert sharding.shard_count("train", 1000, 10, {"train": 64}, 256) == 64
    assert sharding.shard_count("train", 3, 10, 8, 256) == 3  # never an empty shard


def test_shard_names():
    assert sharding.shard_name("train", 3, 100) == "train-00003-of-00100.tfrecord"
    assert sharding.shard_name("validation", 0, 8, "gzip") == "validation-00000-of-00008.tfrecord.gz"


def test_framing_reads_back_with_tensorflow(tmp_path):
    records = [b"", b"a", bytes(range(256)) * 100]
    path = write_records(tmp_path / "c.tfrecord", records)
    assert [r.numpy() for r in tf.data.TFRecordDataset(path)] == records
    with open(path, "rb") as f:
        assert [r for _, _, r in tfrecord.iter_framed(f)] == records


def test_corrupt_record_is_named(tmp_path):
    path = write_records(tmp_path / "c.tfrecord", [b"hello world"] * 3)
    data = bytearray(open(path, "rb").read())
    data[40] ^= 0xFF
    open(path, "wb").write(bytes(data))
    with pytest.raises(tfrecord.CorruptRecord, match="c.tfrecord: bad data CRC"), open(path, "rb") as f:
        list(tfrecord.iter_framed(f, path))
    path = write_records(tmp_path / "c.tfrecord", [b"hello world"] * 3)
    whole = open(path, "rb").read()
    open(path, "wb").write(whole[:-3])
    with pytest.raises(tfrecord.CorruptRecord, match="truncated"), open(path, "rb") as f:
        list(tfrecord.iter_framed(f, path))


def test_shards_partition_the_chunks_and_balance(tmp_path):
    # Chunks as a runner may deliver them: each one a single class.
    chunk_list = [write_chunk(tmp_path / f"train-{c}.tfrecord", [f"{c}:{i}".encode() for i in range(n)]) for c, n in [("a", 50), ("b", 31), ("c", 19)]]
    seen, sizes = [], []
    for index in range(4):
        dest = str(tmp_path / sharding.shard_name("train", index, 4))
        examples, nbytes, digest = shard(chunk_list, index, 4, dest, seed="train")
        records = [r.numpy().decode() for r in tf.data.TFRecordDataset(dest)]
        assert examples == len(records) == sharding.shard_size(100, index, 4)
        assert nbytes == len(open(dest, "rb").read()) and digest == hashlib.sha256(open(dest, "rb").read()).hexdigest()
        assert {r[0] for r in records} == {"a", "b", "c"}  # every shard mixes every class
        seen += records
        sizes.append(examples)
    assert sorted(seen) == sorted(f"{c}:{i}" for c, n in [("a", 50), ("b", 31), ("c", 19)] for i in range(n))
    assert max(sizes) - min(sizes) <= 1


def test_shard_order_is_shuffled_and_repeatable(tmp_path):
    chunk_list = [write_chunk(tmp_path / "train-a.tfrecord", [str(i).encode() * 1000 for i in range(200)])]
    unshuffled = open(chunk_list[0][0], "rb").read()[:chunk_list[0][2]]
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    sharding.SHUFFLE_BUFFER, saved = 50_000, sharding.SHUFFLE_BUFFER  # smaller than the shard: the buffer's path too
    try:
        shard(chunk_list, 0, 1, a, seed="s")
        shard(chunk_list, 0, 1, b, seed="s")
    finally:
        sharding.SHUFFLE_BUFFER = saved
    assert open(a, "rb").read() == open(b, "rb").read()
    assert open(a, "rb").read() != unshuffled
    assert sorted(r.numpy() for r in tf.data.TFRecordDataset(a)) == sorted(str(i).encode() * 1000 for i in range(200))


def test_gzip_shard(tmp_path):
    chunk_list = [write_chunk(tmp_path / "train-a.tfrecord", [b"x" * 1000] * 10)]
    dest = str(tmp_path / "s.tfrecord.gz")
    examples, nbytes, digest = shard(chunk_list, 0, 1, dest, "gzip")
    raw = open(dest, "rb").read()
    assert examples == 10 and nbytes == len(raw) and digest == hashlib.sha256(raw).hexdigest()
    assert len(gzip.decompress(raw)) == 10 * (1000 + 16)
    assert sum(1 for _ in tf.data.TFRecordDataset(dest, compression_type="GZIP")) == 10


def test_index_mismatch_is_an_error(tmp_path):
    path, n, nbytes = write_chunk(tmp_path / "train-a.tfrecord", [b"a", b"b"])
    with pytest.raises(tfrecord.CorruptRecord, match="train-a.tfrecord: its index does not list 3 records"):
        list(sharding.plan([(path, 3, nbytes)], 1))
    with pytest.raises(tfrecord.CorruptRecord, match="train-a.tfrecord: its index does not list 2 records ending at byte 7"):
        list(sharding.plan([(path, n, 7)], 1))


def test_a_damaged_chunk_is_named(tmp_path):
    path, n, nbytes = write_chunk(tmp_path / "train-a.tfrecord", [b"hello world" * 10] * 5)
    data = bytearray(open(path, "rb").read())
    data[nbytes - 10] ^= 0xFF
    open(path, "wb").write(bytes(data))
    with pytest.raises(tfrecord.CorruptRecord, match="train-a.tfrecord: bad data CRC"):
        shard([(path, n, nbytes)], 0, 1, str(tmp_path / "s"))
    open(path, "wb").write(bytes(data[:nbytes - 30]))  # cut short: the index is gone too
    with pytest.raises(tfrecord.CorruptRecord, match="train-a.tfrecord: its index does not list 5 records"):
        shard([(path, n, nbytes)], 0, 1, str(tmp_path / "s"))


def test_spread_order_samples_every_run_evenly():
    for n in (1, 2, 7, 100, 1000, 1025):
        order = chunks.spread_order(n)
        assert sorted(order.tolist()) == list(range(n))
    order = chunks.spread_order(1000)
    for k in (10, 37, 100):
        for start in range(0, 1000 - k, 97):
            run = np.sort(order[start:start + k])
            # every run of k covers the whole range, with no gap wider than 4n/k (an arrival-order
            # run of k would be one block of k neighbours)
            assert run[0] < 4 * 1024 / k and run[-1] > 1000 - 4 * 1024 / k
            assert np.diff(run).max() <= 4 * 1024 / k


def test_chunk_writer_stores_spread_order_and_index(tmp_path):
    records = [f"r{i}".encode() * (1 + i % 7) for i in range(300)]
    writer = chunks.ChunkWriter(str(tmp_path / "train-x.tfrecord"))
    for record in records:
        writer.add(tfrecord.frame(record))
    temp = writer.temp
    path, n, nbytes = writer.publish()
    assert n == 300 and not os.path.exists(temp)
    data = open(path, "rb").read()
    stored = [r for _, _, r in tfrecord.iter_framed(io.BytesIO(data[:nbytes]))]  # the records, then the index
    assert stored == [records[j] for j in chunks.spread_order(300)]
    offsets = chunks.read_index(path, n, nbytes)
    assert len(offsets) == 301 and offsets[-1] == nbytes and len(data) == nbytes + 8 * 301


def test_plan_reads_one_range_per_chunk_and_each_byte_once(tmp_path, monkeypatch):
    monkeypatch.setattr(sharding, "MAX_CHUNKS_PER_GROUP", 8)
    sizes = [5 + (i * 7) % 23 for i in range(30)]  # 30 chunks: four groups of 7-8
    chunk_list = [write_chunk(tmp_path / f"train-{i:02d}.tfrecord", [f"{i}:{k}".encode() for k in range(n)]) for i, n in enumerate(sizes)]
    total = sum(sizes)
    smallest_group = min(sum(n for _, n, _ in group) for group in sharding.groups(chunk_list))
    for count in (1, 3, 10, total):
        covered = {path: [] for path, *_ in chunk_list}
        planned = list(sharding.plan(chunk_list, count))
        assert [i for i, _ in planned] == list(range(count))
        for index, ranges in planned:
            assert sum(n for *_, n in ranges) == sharding.shard_size(total, index, count)
            assert len({p for p, *_ in ranges}) == len(ranges)  # one range per chunk
            if sharding.shard_size(total, index, count) <= smallest_group:
                assert len(ranges) <= 2 * 8  # within one group, or across the edge of two
            for path, start, end, _ in ranges:
                covered[path].append((start, end))
        for path, _, nbytes in chunk_list:  # the ranges tile each chunk's records: every byte read once
            spans = sorted(covered[path])
            assert spans[0][0] == 0 and spans[-1][1] == nbytes
            assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))


def test_shards_mix_classes_from_class_sorted_chunks(tmp_path):
    # One bundle holding the classes one after another (a folder each), as the DirectRunner reads them.
    records = [f"{c}:{i}".encode() for c in "abcdefghij" for i in range(100)]
    writer = chunks.ChunkWriter(str(tmp_path / "train-x.tfrecord"))
    for record in records:
        writer.add(tfrecord.frame(record))
    chunk_list = [writer.publish()]
    for index in range(8):
        dest = str(tmp_path / f"s{index}")
        shard(chunk_list, index, 8, dest, seed="train")
        labels = [r.numpy()[:1] for r in tf.data.TFRecordDataset(dest)]
        per_class = {c: labels.count(c.encode()) for c in "abcdefghij"}
        assert all(11 <= n <= 14 for n in per_class.values()), per_class  # 12.5 each
