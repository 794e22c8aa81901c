"""Find damaged shards: which file, and how many of its records can still be read."""

import tensorflow as tf

from trainer.dataset import DatasetInfo


class CorruptShard(ValueError):
    """A shard that cannot be read to its end; the message names it and says what to do."""


def readable_records(path: str, compression: str):
    """(records readable, error or None): TFRecord readers stop at the first damaged record."""
    count = 0
    try:
        for _ in tf.data.TFRecordDataset(path, compression_type=compression, buffer_size=8 << 20):
            count += 1
    except tf.errors.DataLossError as e:
        return count, e.message.split(" [Op:")[0].split("}} ")[-1]
    return count, None


def scan(info: DatasetInfo, split: str) -> dict:
    """Per damaged shard of a split: {path: (readable, expected, error)}; empty when all read cleanly."""
    damaged = {}
    for path, expected in info.shard_examples(split).items():
        readable, error = readable_records(path, info.compression)
        if error is not None or readable != expected:
            damaged[path] = (readable, expected, error or f"{readable} records, dataset.json says {expected}")
    return damaged


def corrupt_error(info: DatasetInfo, splits) -> CorruptShard:
    """The error to stop with after a DataLossError: it names each damaged shard."""
    found = {path: report for split in splits for path, report in scan(info, split).items()}
    if not found:
        return CorruptShard(f"{info.data_dir}: a shard failed to read but reads cleanly now; check the storage and retry")
    lines = [f"{path}: {error} ({readable} of {expected} records readable)" for path, (readable, expected, error) in sorted(found.items())]
    return CorruptShard(
        f"corrupt shard(s): {'; '.join(lines)}. Run `beam-etl verify {info.data_dir}` to see every problem, "
        "convert again, or train with --skip_corrupt to skip the damaged records"
    )
