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


# Formats Pillow writes here; each file in the robustness corpus is made by Pillow itself.
WRITABLE = ["BMP", "DIB", "GIF", "ICO", "JPEG", "JPEG2000", "PCX", "PNG", "PPM", "SGI", "TGA", "TIFF", "WEBP", "IM", "QOI", "DDS", "ICNS"]


def animated(fmt: str, frames: int = 3) -> bytes:
    images = [photo(24, 16, seed=s) for s in range(frames)]
    return encode(images[0], fmt, save_all=True, append_images=images[1:], duration=100, loop=0)


def robustness_corpus(root) -> dict:
    """Write the corpus under root/<label>/...; returns {relpath: expected reason, or None when it is valid}."""
    import os

    from beam_etl import images

    good = jpeg(48, 40, seed=7)
    files = {}
    for fmt in WRITABLE:
        ext = {"JPEG2000": "jp2", "DIB": "dib"}.get(fmt, fmt.lower())
        files[f"formats/{fmt.lower()}.{ext}"] = (encode(photo(24, 20, seed=len(files)), fmt), None)
    files["formats/cmyk.jpg"] = (encode(photo(24, 20, mode="CMYK"), "JPEG"), None)
    files["formats/png16.png"] = (png16_gray(), None)
    files["formats/palette_transparent.png"] = (encode(photo(24, 20).convert("P"), "PNG", transparency=0), None)
    files["formats/gray_alpha.png"] = (encode(photo(24, 20, mode="LA"), "PNG"), None)
    files["formats/progressive.jpg"] = (jpeg(48, 40, seed=8, progressive=True), None)
    files["animated/animated.gif"] = (animated("GIF"), None)
    files["animated/animated.png"] = (animated("PNG"), None)  # APNG
    files["animated/animated.webp"] = (animated("WEBP"), None)
    for orientation in range(1, 9):
        files[f"exif/orientation_{orientation}.jpg"] = (exif_rotated_jpeg(orientation, 40, 24), None)
    source = jpeg(120, 90, seed=9)
    for keep in (0.1, 0.5, 0.95):
        files[f"broken/truncated_{int(keep * 100)}.jpg"] = (source[: int(len(source) * keep)], "truncated|corrupt")
    flipped = bytearray(source)
    for position in range(200, len(flipped), 97):
        flipped[position] ^= 0x55
    files["broken/bitflipped.jpg"] = (bytes(flipped), "corrupt|truncated|not_an_image|ok")  # flips may hit the header, or decode as noise
    files["broken/zero.jpg"] = (b"", images.EMPTY)
    files["broken/notes.jpg"] = (b"these are notes, not a picture\n" * 20, images.NOT_AN_IMAGE)
    files["broken/page.jpg"] = (b"<!doctype html><html><body>Not found</body></html>", images.NOT_AN_IMAGE)
    files["broken/png_named.jpg"] = (encode(photo(24, 20), "PNG"), None)  # the bytes decide, not the name
    files["huge/bomb.png"] = (bomb_png(), images.TOO_MANY_PIXELS)
    files["huge/bomb.jpg"] = (jpeg_claiming(60_000, 60_000), images.TOO_MANY_PIXELS)
    files["huge/real_20000.png"] = (encode(Image.new("1", (20_000, 20_000)), "PNG"), images.TOO_MANY_PIXELS)
    files["names/\u00e9t\u00e9 \u65e5\u672c photo.jpg"] = (good, None)
    files["names/with spaces and, comma.jpg"] = (jpeg(30, 20, seed=10), None)
    files["dups/a.jpg"] = (good, None)  # duplicates of names/été...jpg under other names and classes
    files["dups_other_class/b.jpg"] = (good, None)
    for rel, (data, _) in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    os.symlink(root / "formats" / "png.png", root / "names" / "link_to_png.png")
    files["names/link_to_png.png"] = (None, None)
    return {rel: reason for rel, (_, reason) in files.items()}


def jpeg_claiming(width: int, height: int) -> bytes:
    """A small JPEG whose frame header claims another size."""
    data = bytearray(jpeg(16, 16))
    sof = data.find(b"\xff\xc0")
    data[sof + 5 : sof + 9] = height.to_bytes(2, "big") + width.to_bytes(2, "big")
    return bytes(data)
