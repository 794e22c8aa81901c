"""One reference and its bytes in, one serialised Example and its facts out, or a reject. No Beam."""

import dataclasses
import functools
import hashlib
import typing

from beam_etl import chunks, images, objstore, readahead, schema, sources, tfrecord, workpool
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
    source_bytes: int = -1  # of the input as read
    source_sha256: str = ""  # of the input as read: the stored bytes' for a pass-through image
    mtime: typing.Optional[float] = None  # the input's, as listed (ImageRef.mtime)


def check_label(ref: ImageRef, label_ids: dict) -> int:
    """The label id of a reference, or Rejected when it has none or an unknown one."""
    if not ref.label:
        raise Rejected(images.NO_LABEL, "the file is not inside a label folder (ROOT/<label>/...)")
    try:
        return label_ids[ref.label]
    except KeyError:
        raise Rejected(images.UNKNOWN_LABEL, f"label {ref.label!r} is not in --labels") from None


def make_record(ref: ImageRef, data: bytes, policy: images.Policy, label_ids: dict, schema_name: str, validation_fraction: float = 0.0, test_fraction: float = 0.0,
                scaled: bool = True, timeout_s: float = images.DEFAULT_TIMEOUT_S, inline_bytes: int = 0):
    """(split, Example bytes, Facts) for one image; raises Rejected. The rest: see images.canonicalise."""
    label = check_label(ref, label_ids)
    canon = images.canonicalise(data, policy, scaled, timeout_s, inline_bytes)
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
    source_sha256 = canon.sha256 if canon.passthrough else hashlib.sha256(data).hexdigest()
    facts = Facts(split, ref.key, label, ref.label, canon.height, canon.width, len(example), canon.pixel_mean, canon.pixel_sq_mean, canon.pixel_sha256, canon.passthrough, canon.sha256, ref.uri,
                  len(data), source_sha256, ref.mtime)
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
    timeout_s: float = images.DEFAULT_TIMEOUT_S  # per image, validation and encode (--image_timeout)
    memory_limit_bytes: int = 0  # memory cap per encode process (--image_memory_mb, workpool.limits); 0: none


_MAGIC = ((b"\xff\xd8", "jpeg"), (b"\x89PNG\r\n\x1a\n", "png"))


def relabel(ref: ImageRef, data: bytes, entry: dict, settings: Settings):
    """(split, Example bytes, Facts) for a key whose bytes are those of its ledger line, under its new label or split.

    No decode: the image is stored as its source (pass-through), and the ledger line holds
    the rest of the record. None when that is not so (other bytes, or a re-encoded image):
    then the caller converts it as usual. Raises Rejected for a label --labels lacks.
    """
    source_sha256 = hashlib.sha256(data).hexdigest()
    fmt = next((name for magic, name in _MAGIC if data.startswith(magic)), None)
    if fmt is None or source_sha256 != entry.get("sha256") or entry.get("stored_sha256") != source_sha256:
        return None
    label = check_label(ref, settings.label_ids)
    split = ref.split or assign_split(ref.key, settings.validation_fraction, settings.test_fraction)
    fields = {"image": data, "label": label, "label_text": ref.label, "height": entry["height"], "width": entry["width"],
              "channels": settings.policy.channels, "format": fmt, "key": ref.key, "sha256": source_sha256}
    example = schema.encode_example(fields, settings.schema_name)
    facts = Facts(split, ref.key, label, ref.label, entry["height"], entry["width"], len(example), tuple(entry["pixel_mean"]), tuple(entry["pixel_sq_mean"]),
                  "", True, source_sha256, ref.uri, len(data), source_sha256, ref.mtime)
    return split, example, facts


def fetch(ref: ImageRef, settings: Settings) -> bytes:
    """The input's bytes, checked first for its label (a bad label costs no I/O); raises Rejected."""
    check_label(ref, settings.label_ids)
    objstore.configure_for(ref.uri, settings.filesystem_flags)  # once per process
    return sources.read_bytes(ref, settings.max_file_bytes)


def convert(ref: ImageRef, settings: Settings, data: typing.Optional[bytes] = None):
    """Make the record of one input, read here unless `data` is given: (split, Example bytes, Facts); raises Rejected."""
    if data is None:
        data = fetch(ref, settings)
    # Where no cap can be set (a Beam worker), an image whose size says its work may pass half
    # the cap goes to a process of its own that has it (convert_alone).
    inline = 0 if workpool.in_pool() else settings.memory_limit_bytes // 2
    return make_record(ref, data, settings.policy, settings.label_ids, settings.schema_name, settings.validation_fraction, settings.test_fraction,
                       settings.scaled_decode, settings.timeout_s, inline)


def convert_or_reject(ref: ImageRef, settings: Settings, fetched=None):
    """convert() with the reject as a value: (record, None) or (None, (reason, message)).

    fetched: a Future of fetch(ref, settings), read ahead on another thread (readahead.py).
    In an encode-pool process the work also runs under workpool.limits: a memory cap, and a
    hard time limit that ends the process (the pool then finds the input: workpool.OrderedMap).
    """
    try:
        try:
            data = fetch(ref, settings) if fetched is None else fetched.result()
        except MemoryError:  # read ahead while another image's work held the memory cap: it is free now
            data = fetch(ref, settings)
        with workpool.limits(hard_timeout_s(settings.timeout_s), settings.memory_limit_bytes):
            return convert(ref, settings, data), None
    except Rejected as r:
        return None, (r.reason, r.message)
    except images.TooHeavy:
        return convert_alone(ref, settings, data)
    except MemoryError:  # outside Pillow's calls: our statistics or the Example
        r = images.out_of_memory("its record")
        return None, (r.reason, r.message)


def _convert_given(ref: ImageRef, settings: Settings, data: bytes):
    return convert_or_reject(ref, settings, readahead.done(data))


def convert_alone(ref: ImageRef, settings: Settings, data: bytes):
    """convert_or_reject() in a fresh process under the pool's limits: for a Beam worker, which must live."""
    outcome, value = workpool.run_alone(_convert_given, ref, settings, data)
    return value if outcome == "ok" else crashed(ref, value, settings.timeout_s)


def hard_timeout_s(timeout_s: float) -> float:
    """When a pool process's own alarm ends it: the soft limit plus room for one last decode call."""
    return 2 * timeout_s + 10


def crashed(ref: ImageRef, death: str, timeout_s: float):
    """The outcome of an input that ended a fresh encode process by itself (workpool.OrderedMap's on_crash)."""
    if death == "SIGALRM":  # the process's hard time limit: a decode call that never came back to check
        return None, (images.TIMEOUT, f"the encode did not end within {hard_timeout_s(timeout_s):g} s (--image_timeout {timeout_s:g} s, "
                                      "then its process's hard limit); its process was stopped")
    return None, (images.WORKER_CRASHED, f"the encode process died with {death} on this input, run alone in a fresh process "
                                         "(a crash in an image library, or killed for memory); the other inputs were run again")


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
    """Of records with the same pixels [(key, split, label, uri, size, mtime)], all but the first by key, as reject rows."""
    members = sorted(members, key=lambda m: m[0])
    kept = members[0][0]
    for key, split, label, uri, size, mtime in members[1:]:
        yield {"path": uri, "key": key, "label": label, "reason": "duplicate", "message": f"same pixels as {kept} (kept); sha256 of pixels {pixel_sha256[:16]}",
               "size": size, "mtime": mtime}


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
    return {"path": ref.uri, "key": ref.key, "label": ref.label, "reason": reason, "message": message, "size": ref.size, "mtime": ref.mtime}
