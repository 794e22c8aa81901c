"""TFRecord framing: length, masked CRC-32C, data, masked CRC-32C. Pure Python plus google_crc32c."""

import struct

import google_crc32c

_HEADER = struct.Struct("<Q")
_CRC = struct.Struct("<I")


class CorruptRecord(Exception):
    """A record whose length or CRC does not check out; names the file and offset."""


def _masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame(record: bytes) -> bytes:
    """One record as it is laid out in a .tfrecord file."""
    header = _HEADER.pack(len(record))
    return header + _CRC.pack(_masked_crc(header)) + record + _CRC.pack(_masked_crc(record))


def _read_one(f, name: str, offset: int, check: bool):
    """(framed bytes, record) of the record at the file's position, or None at the end."""
    header = f.read(12)
    if not header:
        return None
    if len(header) < 12:
        raise CorruptRecord(f"{name}: truncated record header at byte {offset}")
    length = record_length(header, name, offset) if check else _HEADER.unpack_from(header)[0]
    body = f.read(length + 4)
    if len(body) < length + 4:
        raise CorruptRecord(f"{name}: truncated record at byte {offset} (wanted {length} bytes)")
    record = body[:length]
    if check:
        _check_data(record, body, length, name, offset)
    return header + body, record


def iter_framed(f, name: str = "<stream>", check: bool = True):
    """Yield (offset, framed_bytes, record) for each record of an open binary file."""
    offset = 0
    while (one := _read_one(f, name, offset, check)) is not None:
        yield offset, *one
        offset += len(one[0])


def read_framed(f, name: str = "<stream>", offset: int = 0) -> bytes:
    """The framed bytes of the record at the file's position (`offset`, for messages), CRCs checked."""
    one = _read_one(f, name, offset, True)
    if one is None:
        raise CorruptRecord(f"{name}: ended at byte {offset}, where a record was expected")
    return one[0]


def record_length(header: bytes, name: str = "<stream>", offset: int = 0) -> int:
    """The data length a 12-byte record header gives, its CRC checked."""
    if _CRC.unpack_from(header, 8)[0] != _masked_crc(header[:8]):
        raise CorruptRecord(f"{name}: bad length CRC at byte {offset}")
    return _HEADER.unpack_from(header)[0]


def _check_data(record: bytes, framed: bytes, crc_at: int, name: str, offset: int) -> None:
    """CorruptRecord unless the data CRC stored at framed[crc_at:] is the record's."""
    if _CRC.unpack_from(framed, crc_at)[0] != _masked_crc(record):
        raise CorruptRecord(f"{name}: bad data CRC in the record at byte {offset}")


def check_framed(framed: bytes, name: str = "<stream>", offset: int = 0) -> None:
    """CorruptRecord unless `framed` is one whole record whose CRCs check out."""
    length = record_length(framed[:12], name, offset)
    if len(framed) != length + 16:
        raise CorruptRecord(f"{name}: truncated record at byte {offset} (wanted {length} bytes)")
    _check_data(framed[12:12 + length], framed, 12 + length, name, offset)
