"""The feature schema: the one place feature keys are written, and the Example encoder."""

import struct

# Roles are what code refers to; names are what the records hold. Readers (the trainer)
# look names up by role in dataset.json and never spell a key themselves.
ROLES = ("image", "label", "label_text", "height", "width", "channels", "format", "key", "sha256")

DTYPES = {
    "image": "string",
    "label": "int64",
    "label_text": "string",
    "height": "int64",
    "width": "int64",
    "channels": "int64",
    "format": "string",
    "key": "string",
    "sha256": "string",
}

NAMES = {
    "default": {role: role for role in ROLES},
    # The tf-slim / TPU reference names, so existing readers of such files work unchanged.
    "imagenet": {
        "image": "image/encoded",
        "format": "image/format",
        "label": "image/class/label",
        "label_text": "image/class/text",
        "height": "image/height",
        "width": "image/width",
        "channels": "image/channels",
        "key": "image/filename",
        "sha256": "image/key/sha256",
    },
}


def names(schema: str) -> dict:
    """Role -> feature name for a schema, or a ValueError naming the choices."""
    try:
        return NAMES[schema]
    except KeyError:
        raise ValueError(f"unknown schema {schema!r}; choose one of {sorted(NAMES)}") from None


def feature_spec_json(schema: str) -> dict:
    """The features as written into dataset.json: role -> name, dtype, shape."""
    return {role: {"name": name, "dtype": DTYPES[role], "shape": []} for role, name in names(schema).items()}


# --- tf.train.Example wire format, written by hand -----------------------------------
# Serialising through the protobuf classes costs 70-240 us per image and needs TensorFlow
# in every Beam worker; these few lines write the same bytes without either. The tests
# parse the result with TensorFlow to keep this honest.


def _varint(value: int) -> bytes:
    out = bytearray()
    value &= 0xFFFFFFFFFFFFFFFF  # negative int64 as two's complement, as protobuf does
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _feature(dtype: str, value) -> bytes:
    if dtype == "string":
        data = value.encode("utf-8") if isinstance(value, str) else bytes(value)
        return _field(1, _field(1, data))  # Feature.bytes_list{value}
    if dtype == "int64":
        return _field(3, _field(1, _varint(int(value))))  # Feature.int64_list{packed value}
    if dtype == "float":
        return _field(2, _field(1, struct.pack("<f", float(value))))
    raise ValueError(f"unsupported dtype {dtype!r}")


def encode_example(values: dict, schema: str = "default") -> bytes:
    """Serialise one record, given by role, as tf.train.Example bytes."""
    entries = []
    for role, name in names(schema).items():
        entry = _field(1, name.encode("utf-8")) + _field(2, _feature(DTYPES[role], values[role]))
        entries.append(_field(1, entry))  # Features.feature map entry
    return _field(1, b"".join(entries))  # Example.features
