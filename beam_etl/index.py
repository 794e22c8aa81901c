"""DALI index files: one `offset size` line per record, the text format of DALI's tfrecord2idx."""

import uuid

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_etl import metadata, tfrecord

SUFFIX = ".idx"


class NotIndexable(ValueError):
    """A dataset whose shards DALI cannot index (gzip), or that is not a complete dataset."""


def index_name(shard_file: str) -> str:
    """The index beside a shard: DALI's own tools name it `<shard>.idx`."""
    return shard_file + SUFFIX


def index_text(f, name: str = "<stream>", check: bool = True) -> tuple:
    """(text, records) of the index of an open uncompressed TFRecord file.

    The size is the whole framed record (12-byte header + data + 4-byte CRC), as
    tfrecord2idx writes it: DALI reads exactly that many bytes at the offset.
    """
    lines = [f"{offset} {len(framed)}\n" for offset, framed, _ in tfrecord.iter_framed(f, name, check)]
    return "".join(lines), len(lines)


def write_index(shard_path: str, index_path: str = "", check: bool = True) -> int:
    """Write the index of one uncompressed shard (atomically: temp, then rename); returns its records."""
    if shard_path.endswith(".gz"):
        raise NotIndexable(f"{shard_path}: gzip shards cannot be indexed for DALI, which reads uncompressed TFRecords; convert with --compression none")
    index_path = index_path or index_name(shard_path)
    with FileSystems.open(shard_path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        text, records = index_text(f, shard_path, check)
    temp = f"{index_path}.{uuid.uuid4().hex}.tmp"
    with FileSystems.create(temp, mime_type="text/plain", compression_type=CompressionTypes.UNCOMPRESSED) as out:
        out.write(text.encode("ascii"))
    if FileSystems.exists(index_path):
        FileSystems.delete([index_path])
    FileSystems.rename([temp], [index_path])
    return records


def index_dataset(data_dir: str) -> int:
    """Add an index beside every shard of a complete dataset and record it in dataset.json; returns the shards indexed."""
    if not metadata.is_complete(data_dir):
        raise NotIndexable(f"{data_dir}: no {metadata.DATASET_JSON}; pass the directory `beam-etl convert --output` wrote")
    document = metadata.read(data_dir)
    if document.get("compression", "none") != "none":
        raise NotIndexable(f"{data_dir}: its shards are {document['compression']}-compressed and DALI indexes only uncompressed TFRecords; reconvert with --compression none")
    count = 0
    for split_name, split in document["splits"].items():
        for shard in split["shards"]:
            path = FileSystems.join(data_dir, shard["file"])
            records = write_index(path)
            if records != shard["examples"]:
                raise tfrecord.CorruptRecord(f"{path}: {records} records, but dataset.json lists {shard['examples']}; the shard is not the one converted")
            shard["index"] = True
            count += 1
        split["index"] = True
    metadata.write_json(FileSystems.join(data_dir, metadata.DATASET_JSON), document)
    return count
