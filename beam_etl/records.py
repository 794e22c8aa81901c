"""One reference and its bytes in, one serialised Example and its facts out, or a reject. No Beam."""

import typing

from beam_etl import images, schema
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


def check_label(ref: ImageRef, label_ids: dict) -> int:
    """The label id of a reference, or Rejected when it has none or an unknown one."""
    if not ref.label:
        raise Rejected(images.NO_LABEL, "the file is not inside a label folder (ROOT/<label>/...)")
    try:
        return label_ids[ref.label]
    except KeyError:
        raise Rejected(images.UNKNOWN_LABEL, f"label {ref.label!r} is not in --labels") from None


def make_record(ref: ImageRef, data: bytes, policy: images.Policy, label_ids: dict, schema_name: str, validation_fraction: float = 0.0, test_fraction: float = 0.0):
    """(split, Example bytes, Facts) for one image; raises Rejected."""
    label = check_label(ref, label_ids)
    canon = images.canonicalise(data, policy)
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
    facts = Facts(split, ref.key, label, ref.label, canon.height, canon.width, len(example), canon.pixel_mean, canon.pixel_sq_mean, canon.pixel_sha256, canon.passthrough)
    return split, example, facts


def reject_row(ref: ImageRef, reason: str, message: str) -> dict:
    """One line of rejected.jsonl."""
    return {"path": ref.uri, "key": ref.key, "label": ref.label, "reason": reason, "message": message}
