"""One reference and its bytes in, one serialised Example and its facts out, or a reject. No Beam."""

import dataclasses
import functools
import typing

from beam_etl import chunks, images, objstore, readahead, schema, sources, tfrecord
from beam_etl.images import Rejected
from beam_etl.sources import ImageRef, assign_split


class Facts(typing.NamedTuple):
    """What the analysis, the counts and the metadata need of a record: small, no payload."""

    split: str
    key: str
    label: int
    label_text: str
    height: int
    width: int
    nbytes: int
    pixel_mean: tuple
    pixel_sq_mean: tuple
    pixel_sha256: str
    passthrough: bool
    sha256: str  # of the stored image bytes
    uri: str


def check_label(ref: ImageRef, label_ids: dict) -> int:
    """The label id of a reference, or Rejected when it has none or an unknown one."""
    if not ref.label:
        raise Rejected(images.NO_LABEL, "the file is not inside a label folder (ROOT/<label>/...)")
    try:
        return label_ids[ref.label]
    except KeyError:
        raise Rejected(images.UNKNOWN_LABEL, f"label {ref.label!r} is not in --labels") from None


def make_record(ref: ImageRef, data: bytes, policy: images.Policy, label_ids: dict, schema_name: str, validation_fraction: float = 0.0, test_fraction: float = 0.0,
                scaled: bool = True):
    """(split, Example bytes, Facts) for one image; raises Rejected. scaled: see images.canonicalise."""
    label = check_label(ref, label_ids)
    canon = images.canonicalise(data, policy, scaled)
    split = ref.split or assign_split(ref.key, validation_fraction, test_fraction)
    example = schema.encode_example(
        {
            "image": canon.data,
            "label": label,
            "label_text": ref.label,
            "height": canon.height,
            "width": canon.width,
            "channels": canon.channels,
            "format": canon.format,
            "key": ref.key,
            "sha256": canon.sha256,
        },
        schema_name,
    )
    facts = Facts(split, ref.key, label, ref.label, canon.height, canon.width, len(example), canon.pixel_mean, canon.pixel_sq_mean, canon.pixel_sha256, canon.passthrough, canon.sha256, ref.uri)
    return split, example, facts


@dataclasses.dataclass(frozen=True)
class Settings:
    """What the per-image work needs besides the reference; small and picklable, for worker processes."""

    policy: images.Policy
    label_ids: dict
    schema_name: str = "default"
    validation_fraction: float = 0.0
    test_fraction: float = 0.0
    max_file_bytes: int = 64_000_000
    filesystem_flags: tuple = ()  # Beam flags for FileSystems in worker processes: S3 endpoint, keys
    reads_in_flight: int = 1  # reads kept ahead of the decode in each worker (readahead.py)
    scaled_decode: bool = True  # pass-through JPEGs validated at 1/8 scale; False: bench/baseline.py's full decode


def fetch(ref: ImageRef, settings: Settings) -> bytes:
    """The input's bytes, checked first for its label (a bad label costs no I/O); raises Rejected."""
    check_label(ref, settings.label_ids)
    objstore.configure_for(ref.uri, settings.filesystem_flags)  # once per process
    return sources.read_bytes(ref, settings.max_file_bytes)


def convert(ref: ImageRef, settings: Settings, data: typing.Optional[bytes] = None):
    """Make the record of one input, read here unless `data` is given: (split, Example bytes, Facts); raises Rejected."""
    if data is None:
        data = fetch(ref, settings)
    return make_record(ref, data, settings.policy, settings.label_ids, settings.schema_name, settings.validation_fraction, settings.test_fraction,
                       settings.scaled_decode)


def convert_or_reject(ref: ImageRef, settings: Settings, fetched=None):
    """convert() with the reject as a value: (record, None) or (None, (reason, message)).

    fetched: a Future of fetch(ref, settings), read ahead on another thread (readahead.py).
    """
    try:
        return convert(ref, settings, None if fetched is None else fetched.result()), None
    except Rejected as r:
        return None, (r.reason, r.message)


def convert_chunk(refs, settings: Settings) -> list:
    """convert_or_reject() of each ref in order, with settings.reads_in_flight reads ahead of the decode."""
    read = functools.partial(fetch, settings=settings)
    return [convert_or_reject(ref, settings, fetched) for ref, fetched in readahead.each(read, refs, settings.reads_in_flight)]


STAGE_MEMORY_BYTES = 32 << 20  # a split's records held per task before they go to a chunk: bounds a worker's memory


def stage_chunk(refs, settings: Settings, chunk_dir: str) -> list:
    """convert_chunk(), with the records written here to chunk files of chunk_dir (chunks.py), not returned.

    Each result is (record without its Example bytes, reject, staged): record is (split, None,
    Facts) or None, and staged lists the (split, (chunk path, examples, bytes)) that the chunk's
    last input completed. The payloads stay in this process; only facts and descriptors travel.
    """
    import uuid

    objstore.configure_for(chunk_dir, settings.filesystem_flags)  # once per process
    held, held_bytes, results = {}, {}, []  # split -> [framed records]

    def flush(split):
        framed = held.pop(split)
        held_bytes.pop(split)
        dest = objstore.join(chunk_dir, f"{split}-{uuid.uuid4().hex}.tfrecord")
        return split, chunks.write_chunk(dest, framed)

    for ref, (record, reject) in zip(refs, convert_chunk(refs, settings)):
        staged = []
        if record is not None:
            split, example, facts = record
            framed = tfrecord.frame(example)
            held.setdefault(split, []).append(framed)
            held_bytes[split] = held_bytes.get(split, 0) + len(framed)
            if held_bytes[split] >= STAGE_MEMORY_BYTES:
                staged.append(flush(split))
            record = (split, None, facts)
        results.append((record, reject, staged))
    if results:
        results[-1][2].extend(flush(split) for split in list(held))
    return results


def duplicates_to_drop(pixel_sha256: str, members):
    """Of records with the same pixels [(key, split, label, uri)], all but the first by key, as reject rows."""
    members = sorted(members)
    kept = members[0][0]
    for key, split, label, uri in members[1:]:
        yield {"path": uri, "key": key, "label": label, "reason": "duplicate", "message": f"same pixels as {kept} (kept); sha256 of pixels {pixel_sha256[:16]}"}


def leakage(sha256: str, members):
    """One image stored in several splits [(split, key)]: a leakage group, or None."""
    splits = {}
    for split, key in sorted(members):
        splits.setdefault(split, []).append(key)
    return {"sha256": sha256, "keys": splits} if len(splits) > 1 else None


def key_of(serialized: bytes, schema_name: str) -> str:
    """The key feature of a serialised record."""
    return schema.by_role(serialized, schema_name)["key"].decode("utf-8")


def reject_row(ref: ImageRef, reason: str, message: str) -> dict:
    """One line of rejected.jsonl."""
    return {"path": ref.uri, "key": ref.key, "label": ref.label, "reason": reason, "message": message}
