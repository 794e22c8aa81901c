"""Images for the tests, made here rather than checked in: every format and the broken ones."""

import io
import struct
import zlib

import numpy as np
from PIL import Image


def photo(width=64, height=48, seed=0, mode="RGB") -> Image.Image:
    """A textured image: gradients plus noise, so JPEG has something to encode."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / max(width - 1, 1), y * 255 / max(height - 1, 1), (x + y) * 127 / max(width + height - 2, 1)], -1)
    arr = np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)
    image = Image.fromarray(arr, "RGB")
    return image if mode == "RGB" else image.convert(mode)


def encode(image: Image.Image, fmt: str, **kwargs) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **kwargs)
    return buf.getvalue()


def jpeg(width=64, height=48, seed=0, **kwargs) -> bytes:
    return encode(photo(width, height, seed), "JPEG", quality=90, **kwargs)


def exif_rotated_jpeg(orientation=6, width=64, height=48) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode(photo(width, height), "JPEG", quality=90, exif=exif.tobytes())


def png16_gray(width=32, height=16) -> bytes:
    arr = np.linspace(0, 65535, width * height).reshape(height, width).astype(np.uint16)  # the full 16-bit range
    return encode(Image.fromarray(arr), "PNG")


def bomb_png(width=100_000, height=100_000) -> bytes:
    """A PNG header that claims gigapixels in a few bytes."""

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def make_folder(root, seeds=range(12), extra=()):
    """Three classes of small JPEG and PNG photos under root, plus `extra` {relpath: bytes}."""
    files = {}
    for i in seeds:
        label = ["ant", "bee", "cow"][i % 3]
        if i % 4 == 0:
            files[f"{label}/img_{i}.png"] = encode(photo(64 + i, 48, seed=i), "PNG")
        else:
            files[f"{label}/img_{i}.jpg"] = jpeg(64 + i, 48, seed=i)
    files.update(extra)
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files
