"""The feature schema: the one place feature keys are written, and the Example encoder."""

import functools
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
    if 0 <= value < 0x80:
        return _BYTES[value]
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


_BYTES = [bytes((i,)) for i in range(0x80)]


def _head(number: int, length: int) -> bytes:
    """The tag and length of a length-delimited field (wire type 2)."""
    return _BYTES[number << 3 | 2] + _varint(length)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _head(number, len(payload)) + payload


def _feature(dtype: str, value) -> bytes:
    if dtype == "string":
        data = value.encode("utf-8") if isinstance(value, str) else bytes(value)
        return _field(1, _field(1, data))  # Feature.bytes_list{value}
    if dtype == "int64":
        return _field(3, _field(1, _varint(int(value))))  # Feature.int64_list{packed value}
    if dtype == "float":
        return _field(2, _field(1, struct.pack("<f", float(value))))
    raise ValueError(f"unsupported dtype {dtype!r}")


@functools.lru_cache(maxsize=None)
def _entries(schema: str) -> tuple:
    """(role, the map entry's encoded key field, dtype) per feature of a schema."""
    return tuple((role, _field(1, name.encode("utf-8")), DTYPES[role]) for role, name in names(schema).items())


def encode_example(values: dict, schema: str = "default") -> bytes:
    """Serialise one record, given by role, as tf.train.Example bytes.

    Each string value is copied once, by the final join: the nested fields' headers are
    worked out from lengths and go in front of it, so an image is not copied per level.
    """
    pieces, total = [b""], 0
    for role, key_field, dtype in _entries(schema):
        value = values[role]
        if dtype == "string":
            tail = value.encode("utf-8") if isinstance(value, str) else bytes(value)
            inner = _head(1, len(tail))  # BytesList.value
            feature = _head(1, len(inner) + len(tail)) + inner  # Feature.bytes_list, without its tail
        else:
            tail, feature = b"", _feature(dtype, value)
        length = len(feature) + len(tail)
        entry = key_field + _head(2, length) + feature  # the map entry's key and value, without the tail
        length += len(entry) - len(feature)
        head = _head(1, length)  # Features.feature map entry
        pieces += (head + entry, tail)
        total += len(head) + length
    pieces[0] = _head(1, total)  # Example.features
    return b"".join(pieces)


def _read_varint(data: bytes, pos: int):
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(data: bytes):
    """Yield (field number, wire type, value) of a protobuf message; value is bytes or an int."""
    pos = 0
    while pos < len(data):
        tag, pos = _read_varint(data, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 2:
            length, pos = _read_varint(data, pos)
            if pos + length > len(data):
                raise ValueError("truncated field")
            yield number, wire, data[pos : pos + length]
            pos += length
        elif wire == 0:
            value, pos = _read_varint(data, pos)
            yield number, wire, value
        elif wire == 5:
            yield number, wire, data[pos : pos + 4]
            pos += 4
        elif wire == 1:
            yield number, wire, data[pos : pos + 8]
            pos += 8
        else:
            raise ValueError(f"unsupported wire type {wire}")


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _decode_feature(data: bytes) -> list:
    values = []
    for kind, _, payload in _fields(data):
        for number, wire, value in _fields(payload):
            if number != 1:
                continue
            if kind == 1:  # bytes_list
                values.append(value)
            elif kind == 3:  # int64_list, packed or not
                if wire == 0:
                    values.append(_signed(value))
                else:
                    pos = 0
                    while pos < len(value):
                        v, pos = _read_varint(value, pos)
                        values.append(_signed(v))
            elif kind == 2:  # float_list: packed (wire 2) or one fixed32 (wire 5), both raw bytes
                values.extend(struct.unpack(f"<{len(value) // 4}f", value))
    return values


def decode_example(serialized: bytes) -> dict:
    """Feature name -> list of values of a serialised tf.train.Example, without TensorFlow."""
    out = {}
    for number, _, features in _fields(serialized):
        if number != 1:
            continue
        for _, _, entry in _fields(features):
            name, value = None, b""
            for field, _, payload in _fields(entry):
                if field == 1:
                    name = payload.decode("utf-8")
                elif field == 2:
                    value = payload
            if name is not None:
                out[name] = _decode_feature(value)
    return out


def by_role(serialized: bytes, schema_name: str = "default") -> dict:
    """A record's values by role: bytes for strings, int for int64."""
    decoded = decode_example(serialized)
    out = {}
    for role, name in names(schema_name).items():
        values = decoded.get(name)
        if not values:
            raise ValueError(f"the record has no feature {name!r} ({role})")
        out[role] = values[0]
    return out
