"""`beam-etl verify DIR`: re-read every shard and check it against dataset.json."""

import hashlib
import io

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from PIL import Image, UnidentifiedImageError

from beam_etl import metadata, schema, sharding, tfrecord

_CHANNELS = {"L": 1, "RGB": 3}


def check_record(serialized: bytes, document: dict, where: str) -> list:
    """Problems with one record: its fields, its checksum, its label and its decoded image."""
    try:
        record = schema.by_role(serialized, document["schema"])
    except ValueError as e:
        return [f"{where}: unparseable record: {e}"]
    problems = []
    if hashlib.sha256(record["image"]).hexdigest() != record["sha256"].decode():
        problems.append(f"{where}: image bytes do not match their sha256")
    labels = document["label_names"]
    if not 0 <= record["label"] < len(labels) or labels[record["label"]] != record["label_text"].decode():
        problems.append(f"{where}: label {record['label']} does not name {record['label_text'].decode()!r}")
    try:
        with Image.open(io.BytesIO(record["image"])) as image:
            image.load()
            got = (image.height, image.width, _CHANNELS.get(image.mode, -1))
    except (UnidentifiedImageError, OSError, ValueError) as e:
        return problems + [f"{where}: image does not decode: {e}"]
    if got != (record["height"], record["width"], record["channels"]):
        problems.append(f"{where}: decodes to {got}, record says {(record['height'], record['width'], record['channels'])}")
    return problems


def verify_shard(data_dir: str, document: dict, shard: dict, decode: bool = True) -> list:
    """Problems with one shard: size, sha256, CRCs, record count and, with decode, every record."""
    path = FileSystems.join(data_dir, shard["file"])
    if not FileSystems.exists(path):
        return [f"{path}: missing"]
    nbytes, digest = sharding.file_digest(path)
    problems = []
    if nbytes != shard["bytes"]:
        problems.append(f"{path}: {nbytes} bytes, dataset.json says {shard['bytes']}")
    if digest != shard["sha256"]:
        problems.append(f"{path}: sha256 {digest[:12]}... does not match dataset.json's {shard['sha256'][:12]}...")
    ctype = CompressionTypes.GZIP if document["compression"] == "gzip" else CompressionTypes.UNCOMPRESSED
    count = 0
    try:
        with FileSystems.open(path, compression_type=ctype) as f:
            for offset, _, record in tfrecord.iter_framed(f, path):
                count += 1
                if decode:
                    problems += check_record(record, document, f"{path} record {count - 1} (byte {offset})")
    except (tfrecord.CorruptRecord, OSError, EOFError) as e:
        return problems + [str(e) if isinstance(e, tfrecord.CorruptRecord) else f"{path}: unreadable: {e}"]
    if count != shard["examples"]:
        problems.append(f"{path}: {count} records, dataset.json says {shard['examples']}")
    return problems


def verify(data_dir: str, decode: bool = True, log=print, version=None) -> list:
    """Every problem found in the dataset at `data_dir` (or its version `version`); an empty list means it is sound."""
    document = metadata.read_version(data_dir, version)
    problems = []
    excluded = document.get("excluded", {}).get("by_split", {})  # old records a later version dropped (convert --update)
    for name, split in document["splits"].items():
        if split["examples"] != sum(s["examples"] for s in split["shards"]) - excluded.get(name, 0):
            problems.append(f"split {name}: examples {split['examples']} is not the sum over its shards less {excluded.get(name, 0)} excluded")
        for shard in split["shards"]:
            found = verify_shard(data_dir, document, shard, decode)
            log(f"{'ok  ' if not found else 'BAD '} {shard['file']}: {shard['examples']} records")
            problems += found
    return problems
