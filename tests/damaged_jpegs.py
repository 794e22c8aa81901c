"""A generated corpus of damaged JPEGs: every kind of damage, from sources of every JPEG kind."""

import io
import random

import numpy as np
from PIL import Image


def _texture(width: int, height: int, seed: int) -> Image.Image:
    """A photo-like picture: gradients plus noise, so every block has entropy-coded detail."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([(x * 255 // width), (y * 255 // height), ((x + y) * 127 // (width + height))], axis=-1)
    noisy = base + rng.normal(0, 25, size=base.shape)
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8), "RGB")


def sources() -> dict:
    """{name: JPEG bytes}: baseline 4:2:0 / 4:2:2 / 4:4:4, grayscale, progressive, restart markers, CMYK, EXIF."""
    picture = _texture(200, 152, seed=7)
    exif = Image.Exif()
    exif[0x0112] = 1  # orientation 1: still passed through
    exif[0x010F] = "test camera"
    out = {}
    for name, image, kwargs in (
        ("baseline_420", picture, {"quality": 90}),
        ("baseline_422", picture, {"quality": 90, "subsampling": 1}),
        ("baseline_444", picture, {"quality": 95, "subsampling": 0}),
        ("grayscale", picture.convert("L"), {"quality": 90}),
        ("progressive", picture, {"quality": 90, "progressive": True}),
        ("progressive_gray_optimized", picture.convert("L"), {"quality": 85, "progressive": True, "optimize": True}),
        ("restart_markers", picture, {"quality": 90, "restart_marker_blocks": 4}),
        ("cmyk", picture.convert("CMYK"), {"quality": 90}),
        ("exif", picture, {"quality": 90, "exif": exif.tobytes()}),
    ):
        buf = io.BytesIO()
        image.save(buf, "JPEG", **kwargs)
        out[name] = buf.getvalue()
    return out


def segments(data: bytes):
    """[(marker byte, start, end)] of the header segments up to and including SOS; then the scan data's span."""
    found, pos = [(0xD8, 0, 2)], 2
    while pos + 4 <= len(data) and data[pos] == 0xFF:
        marker = data[pos + 1]
        length = int.from_bytes(data[pos + 2 : pos + 4], "big")
        found.append((marker, pos, pos + 2 + length))
        pos += 2 + length
        if marker == 0xDA:  # SOS: entropy-coded data follows
            break
    return found, (pos, len(data) - 2)  # the data runs to the final EOI


def _flip(data: bytes, position: int, bit: int) -> bytes:
    out = bytearray(data)
    out[position] ^= 1 << bit
    return bytes(out)


def damaged(name: str, data: bytes, rng: random.Random):
    """Yield (description, bytes) for every kind of damage to one source."""
    header, (data_start, data_end) = segments(data)
    header_end = data_start
    for percent in range(2, 100, 2):  # truncated at every 2% of the file
        cut = len(data) * percent // 100
        yield f"{name}: truncated at {percent}% ({cut} bytes)", data[:cut]
    yield f"{name}: truncated before EOI", data[:-2]
    yield f"{name}: truncated in the EOI", data[:-1]
    for _ in range(40):  # single bit-flips in the headers
        pos = rng.randrange(2, header_end)
        yield f"{name}: bit flip in the headers at {pos}", _flip(data, pos, rng.randrange(8))
    for _ in range(100):  # single bit-flips in the entropy-coded data
        pos = rng.randrange(data_start, data_end)
        yield f"{name}: bit flip in the scan data at {pos}", _flip(data, pos, rng.randrange(8))
    for where, (lo, hi) in (("headers", (2, header_end)), ("scan data", (data_start, data_end))):
        for _ in range(20):  # bursts of 2 to 32 random bytes
            size = rng.randrange(2, 33)
            pos = rng.randrange(lo, max(lo + 1, hi - size))
            burst = bytes(rng.randrange(256) for _ in range(size))
            yield f"{name}: {size}-byte burst in the {where} at {pos}", data[:pos] + burst + data[pos + size :]
    names = {0xD8: "SOI", 0xC0: "SOF0", 0xC1: "SOF1", 0xC2: "SOF2", 0xC4: "DHT", 0xDB: "DQT", 0xDA: "SOS", 0xDD: "DRI"}
    for marker, start, end in header:
        label = names.get(marker, f"APP/other 0x{marker:02X}")
        yield f"{name}: {label} removed", data[:start] + data[end:]
        yield f"{name}: {label} marker byte changed", data[: start + 1] + bytes([0x01]) + data[start + 2 :]
        if end - start > 4:
            yield f"{name}: {label} length too long", data[: start + 2] + (end - start + 40).to_bytes(2, "big") + data[start + 4 :]
            yield f"{name}: {label} length too short", data[: start + 2] + (2).to_bytes(2, "big") + data[start + 4 :]
            yield f"{name}: {label} body zeroed", data[: start + 4] + bytes(end - start - 4) + data[end:]
    restarts = [i for i in range(data_start, data_end - 1) if data[i] == 0xFF and 0xD0 <= data[i + 1] <= 0xD7]
    for pos in restarts[:6]:
        yield f"{name}: RST at {pos} removed", data[:pos] + data[pos + 2 :]
        yield f"{name}: RST at {pos} renumbered", data[: pos + 1] + bytes([0xD0 + (data[pos + 1] - 0xD0 + 3) % 8]) + data[pos + 2 :]
    yield f"{name}: EOI removed", data[:-2]
    yield f"{name}: EOI replaced", data[:-2] + b"\xff\x00"
    for junk in (b"\x00" * 100, b"junk after the end", bytes(rng.randrange(256) for _ in range(500)), data[:200]):
        yield f"{name}: {len(junk)} bytes after EOI", data + junk
    for fake in (b"\xff\xd9", b"\xff\xd8", b"\xff\xc4\x00\x03\x00", b"\xff\xda\x00\x02", b"\xff\xd3"):
        for _ in range(3):
            pos = rng.randrange(data_start, data_end)
            yield f"{name}: fake marker {fake[:2].hex()} in the scan data at {pos}", data[:pos] + fake + data[pos:]


def corpus(seed: int = 31) -> list:
    """[(description, bytes)] over every source: well over 2,000 damaged JPEGs, the same every run."""
    rng = random.Random(seed)
    out = []
    for name, data in sources().items():
        out.append((f"{name}: intact", data))
        out.extend(damaged(name, data, rng))
    return out
