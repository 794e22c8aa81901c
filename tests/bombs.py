"""Inputs whose headers pass every check but whose work does not: a time bomb, a memory bomb, a crash."""

import io

from PIL import Image

CRASH_MAGIC = b"BEAMETL-CRASH:"  # 14 bytes: Pillow matches on the first 16. tests/crash_plugin decodes such a file by killing its process


def _segments(data: bytes):
    """(marker, start, end) of each JPEG segment after SOI; an SOS segment includes its entropy-coded data."""
    at, out = 2, []
    while at < len(data):
        marker = data[at + 1]
        if marker == 0xD9:  # EOI
            out.append((marker, at, at + 2))
            return out
        end = at + 2 + int.from_bytes(data[at + 2:at + 4], "big")
        if marker == 0xDA:  # up to the next marker that is not a stuffed byte or a restart marker
            while not (data[end] == 0xFF and data[end + 1] != 0 and not 0xD0 <= data[end + 1] <= 0xD7):
                end += 1
        out.append((marker, at, end))
        at = end
    return out


def progressive_time_bomb(side: int = 8192, scans: int = 10_000) -> bytes:
    """A valid progressive JPEG with `scans` extra scans of ~33 bytes, each of which libjpeg runs over every block.

    A flat image's AC scans are a single end-of-band run: repeating one costs a pass over the
    image per 33 bytes. At 8192 px a side each costs ~1.7 ms here, so the stock decode of the
    default takes ~17 s for a 1 MB file whose header declares 67 MP (under --max_pixels).
    """
    buf = io.BytesIO()
    Image.new("RGB", (side, side), (120, 130, 140)).save(buf, "JPEG", quality=90, progressive=True)
    data = buf.getvalue()
    segments = _segments(data)
    _, start, end = min((s for s in segments if s[0] == 0xDA), key=lambda s: s[2] - s[1])
    eoi = segments[-1][1]
    return data[:eoi] + data[start:end] * scans + data[eoi:]


def memory_bomb(side: int = 9000) -> bytes:
    """A 0.3 MB PNG of a flat RGBA image of side x side (81 MP, under --max_pixels): its work peaks at ~1.3 GB."""
    buf = io.BytesIO()
    Image.new("RGBA", (side, side), (10, 200, 30, 128)).save(buf, "PNG", compress_level=1)
    return buf.getvalue()


def crash_file(signal_name: str = "SIGSEGV") -> bytes:
    """A file that tests/crash_plugin's format decodes by sending its own process `signal_name` (HANG: by hanging)."""
    return CRASH_MAGIC + signal_name.encode() + b"\n" + bytes(64)
