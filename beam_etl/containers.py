"""The sizes a container declares for every frame, page and sub-image, read from headers only.

Pillow decodes one frame or sub-image; a hostile file declares a huge one elsewhere (an ICO
entry, a TIFF page, an MPO frame, a GIF or APNG frame) that another reader would decode. These
readers walk the headers, never the pixels, so the caller can check every size against
--max_pixels before anything is decoded. Pillow only, no Beam or TF.
"""

import io
import struct

from PIL import Image

_PNG = b"\x89PNG\r\n\x1a\n"


def declared_sizes(im: Image.Image, data: bytes):
    """Yield (width, height, what) for each frame or sub-image `im`'s container declares, lazily."""
    readers = {"ICO": _ico, "ICNS": _icns, "GIF": _gif, "PNG": _apng, "TIFF": _pages, "MPO": _mpo}
    reader = readers.get(im.format or "")
    if reader is not None:
        yield from reader(im, data)


def _png_size(chunk: bytes):
    """(width, height) from a PNG's IHDR, or None when `chunk` is no PNG."""
    if chunk[:8] != _PNG or len(chunk) < 24:
        return None
    return struct.unpack(">II", chunk[16:24])


def _ico(im, data):
    for n, entry in enumerate(im.ico.entry):
        sub = data[entry.offset : entry.offset + 24]
        size = _png_size(sub)
        if size is None and len(sub) >= 12:  # a DIB: BITMAPINFOHEADER width, height (XOR + AND masks)
            width, height = struct.unpack("<ii", sub[4:12])
            size = (abs(width), abs(height) // 2)
        if size is not None:
            yield size[0], size[1], f"icon {n}"


def _icns(im, data):
    for sig, (start, length) in im.icns.dct.items():
        head = data[start : start + min(length, 64)]
        size = _png_size(head)
        if size is None and head[:4] in (b"\xff\x4f\xff\x51", b"\x00\x00\x00\x0c"):  # JPEG 2000
            size = Image.open(io.BytesIO(data[start : start + length])).size  # a header read
        if size is not None:
            yield size[0], size[1], f"icon {sig.decode('latin-1', 'replace')}"


def _gif(im, data):
    """Each image descriptor: its size, and the canvas Pillow grows to hold it."""
    pos = 13
    if len(data) < pos:
        return
    flags = data[10]
    if flags & 0x80:
        pos += 3 << ((flags & 7) + 1)
    frame = 0
    while pos < len(data):
        block = data[pos]
        if block == 0x2C and pos + 10 <= len(data):  # image descriptor
            left, top, width, height, flags = struct.unpack("<HHHHB", data[pos + 1 : pos + 10])
            yield width, height, f"frame {frame}"
            yield left + width, top + height, f"frame {frame} placed at {left},{top}"
            frame += 1
            pos += 10 + ((3 << ((flags & 7) + 1)) if flags & 0x80 else 0) + 1  # colour table, LZW size
            pos = _skip_sub_blocks(data, pos)
        elif block == 0x21:  # extension: label, then sub-blocks
            pos = _skip_sub_blocks(data, pos + 2)
        else:  # 0x3B trailer, or data Pillow will call corrupt itself
            return


def _skip_sub_blocks(data, pos):
    while pos < len(data) and data[pos]:
        pos += data[pos] + 1
    return pos + 1


def _apng(im, data):
    """Each fcTL (frame control) chunk of an animated PNG: the frame and where it sits."""
    pos, frame = 8, 0
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        if kind == b"fcTL" and length >= 20 and pos + 28 <= len(data):
            width, height, x, y = struct.unpack(">IIII", data[pos + 12 : pos + 28])
            yield width, height, f"frame {frame}"
            yield x + width, y + height, f"frame {frame} placed at {x},{y}"
            frame += 1
        elif kind == b"IEND":
            return
        pos += 12 + length


def _pages(im, data):
    """Every page of a TIFF: seeking reads its IFD, not its pixels."""
    current, page = im.tell(), 0
    try:
        while True:  # not n_frames, which walks every page first; the caller stops at its limit
            try:
                im.seek(page)
            except EOFError:
                return
            yield im.size[0], im.size[1], f"page {page}"
            page += 1
    finally:
        im.seek(current)


def _mpo(im, data):
    """Every frame of an MPO (stereo JPEG): the frame header at each offset the MP index gives."""
    offsets = getattr(im, "_MpoImageFile__mpoffsets", [])  # Pillow keeps them private
    for n, offset in enumerate(offsets[1:], start=1):
        yield (*Image.open(io.BytesIO(data[offset:])).size, f"frame {n}")  # JPEG header read
