"""Shard counts and names, TFRecord framing, and shards cut from staged chunks."""

import gzip
import hashlib

import pytest

from beam_etl import sharding, tfrecord

tf = pytest.importorskip("tensorflow")


def write_chunk(path, records):
    offsets, position = [], 0
    with open(path, "wb") as f:
        for record in records:
            framed = tfrecord.frame(record)
            offsets.append(position)
            position += len(framed)
            f.write(framed)
    sharding.write_index(str(path), offsets)
    return str(path), len(records)


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
    path, _ = write_chunk(tmp_path / "c.tfrecord", records)
    assert [r.numpy() for r in tf.data.TFRecordDataset(path)] == records
    with open(path, "rb") as f:
        assert [r for _, _, r in tfrecord.iter_framed(f)] == records


def test_corrupt_record_is_named(tmp_path):
    path, _ = write_chunk(tmp_path / "c.tfrecord", [b"hello world"] * 3)
    data = bytearray(open(path, "rb").read())
    data[40] ^= 0xFF
    open(path, "wb").write(bytes(data))
    with pytest.raises(tfrecord.CorruptRecord, match="c.tfrecord: bad data CRC"), open(path, "rb") as f:
        list(tfrecord.iter_framed(f, path))
    path, _ = write_chunk(tmp_path / "c.tfrecord", [b"hello world"] * 3)
    whole = open(path, "rb").read()
    open(path, "wb").write(whole[:-3])
    with pytest.raises(tfrecord.CorruptRecord, match="truncated"), open(path, "rb") as f:
        list(tfrecord.iter_framed(f, path))


def test_shards_partition_the_chunks_and_balance(tmp_path):
    # Chunks as a runner may deliver them: each one a single class.
    chunks = [write_chunk(tmp_path / f"train-{c}.tfrecord", [f"{c}:{i}".encode() for i in range(n)]) for c, n in [("a", 50), ("b", 31), ("c", 19)]]
    seen, sizes = [], []
    for index in range(4):
        dest = str(tmp_path / sharding.shard_name("train", index, 4))
        examples, nbytes, digest = sharding.write_shard(chunks, index, 4, dest, seed="train")
        records = [r.numpy().decode() for r in tf.data.TFRecordDataset(dest)]
        assert examples == len(records) == sharding.shard_size(100, index, 4)
        assert nbytes == len(open(dest, "rb").read()) and digest == hashlib.sha256(open(dest, "rb").read()).hexdigest()
        assert {r[0] for r in records} == {"a", "b", "c"}  # every shard mixes every class
        seen += records
        sizes.append(examples)
    assert sorted(seen) == sorted(f"{c}:{i}" for c, n in [("a", 50), ("b", 31), ("c", 19)] for i in range(n))
    assert max(sizes) - min(sizes) <= 1


def test_shard_order_is_shuffled_and_repeatable(tmp_path):
    chunks = [write_chunk(tmp_path / "train-a.tfrecord", [str(i).encode() for i in range(200)])]
    unshuffled = open(chunks[0][0], "rb").read()  # one chunk, one shard: the stride order is the chunk's
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    sharding.write_shard(chunks, 0, 1, a, seed="s")
    sharding.write_shard(chunks, 0, 1, b, seed="s")
    assert open(a, "rb").read() == open(b, "rb").read()
    assert open(a, "rb").read() != unshuffled


def test_gzip_shard(tmp_path):
    chunks = [write_chunk(tmp_path / "train-a.tfrecord", [b"x" * 1000] * 10)]
    dest = str(tmp_path / "s.tfrecord.gz")
    examples, nbytes, digest = sharding.write_shard(chunks, 0, 1, dest, "gzip")
    raw = open(dest, "rb").read()
    assert examples == 10 and nbytes == len(raw) and digest == hashlib.sha256(raw).hexdigest()
    assert len(gzip.decompress(raw)) == 10 * (1000 + 16)
    assert sum(1 for _ in tf.data.TFRecordDataset(dest, compression_type="GZIP")) == 10


def test_index_mismatch_is_an_error(tmp_path):
    path, _ = write_chunk(tmp_path / "train-a.tfrecord", [b"a", b"b"])
    with pytest.raises(tfrecord.CorruptRecord, match="index lists 2 records, expected 3"):
        sharding.locate([(path, 3)], 0, 1)
