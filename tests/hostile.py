"""Files that broke conversions in the wild, made here by editing the header fields of valid files.

Each case is {relpath: (bytes, expected reason, or None for a record)}. See issue 23: DDS and BLP
pixel formats Pillow does not implement, sides JPEG can't hold, TIFF layouts Pillow can't decode,
and containers whose other frames or sub-images declare billions of pixels.
"""

import io
import struct
import zlib

from PIL import Image

from beam_etl import images
from tests.corpus import photo


def _encode(im, fmt, **kw) -> bytearray:
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return bytearray(buf.getvalue())


def _dds(**fields) -> bytes:
    """A valid 8x8 DDS with pixel-format fields overwritten: flags, fourcc, and a DX10 header."""
    data = _encode(photo(8, 8), "DDS")
    if "flags" in fields:
        struct.pack_into("<I", data, 80, fields["flags"])
    if "fourcc" in fields:
        data[84:88] = fields["fourcc"]
    if "dxgi" in fields:  # DX10 extension header: dxgiFormat, dimension, misc, array size, misc2
        data[128:128] = struct.pack("<IIIII", fields["dxgi"], 3, 0, 1, 0)
    return bytes(data)


def _blp(version: str, offset: int, value: int, width: int = 1) -> bytes:
    data = _encode(photo(16, 16).convert("P"), "BLP", blp_version=version)
    data[offset : offset + width] = value.to_bytes(width, "little")
    return bytes(data)


def _tiff_tag(tag: int, value: int, **save) -> bytes:
    """A valid TIFF with one tag of its first IFD set to `value`."""
    data = _encode(photo(16, 16), "TIFF", **save)
    _set_tags(data, struct.unpack_from("<I", data, 4)[0], {tag: value})
    return bytes(data)


def _set_tags(data: bytearray, ifd: int, values: dict) -> int:
    """Overwrite SHORT/LONG tags of the IFD at `ifd`; returns the next IFD's offset."""
    count = struct.unpack_from("<H", data, ifd)[0]
    for n in range(count):
        entry = ifd + 2 + 12 * n
        tag, kind = struct.unpack_from("<HH", data, entry)
        if tag in values:
            struct.pack_into("<H" if kind == 3 else "<I", data, entry + 8, values[tag])
    return struct.unpack_from("<I", data, ifd + 2 + 12 * count)[0]


def _png_claiming(png: bytes, width: int, height: int) -> bytes:
    """The PNG with its IHDR size replaced (CRC fixed, so readers believe it)."""
    data = bytearray(png)
    struct.pack_into(">II", data, 16, width, height)
    struct.pack_into(">I", data, 29, zlib.crc32(bytes(data[12:29])))
    return bytes(data)


def _ico_with_huge_icon() -> bytes:
    """Two icons; the small one (not the one Pillow decodes) embeds a PNG claiming 100,000^2."""
    data = _encode(photo(64, 64, mode="RGBA"), "ICO", sizes=[(16, 16), (64, 64)])
    for n in range(struct.unpack_from("<H", data, 4)[0]):
        entry = 6 + 16 * n
        offset = struct.unpack_from("<I", data, entry + 12)[0]
        if data[entry] == 16:
            data[offset : offset + 33] = _png_claiming(data[offset : offset + 33], 100_000, 100_000)
    return bytes(data)


def _tiff_with_huge_page() -> bytes:
    """Two pages; the second (never decoded by Pillow's default frame) declares 60,000^2."""
    data = _encode(photo(16, 16), "TIFF", save_all=True, append_images=[photo(8, 8)])
    second = _set_tags(data, struct.unpack_from("<I", data, 4)[0], {})
    _set_tags(data, second, {256: 60_000, 257: 60_000})
    return bytes(data)


def gif_descriptors(data: bytes) -> list:
    """Offsets of the image descriptors of a GIF, found by walking its blocks."""
    pos, found = 13 + ((3 << ((data[10] & 7) + 1)) if data[10] & 0x80 else 0), []
    while pos < len(data) and data[pos] != 0x3B:
        if data[pos] == 0x2C:
            found.append(pos)
            flags = data[pos + 9]
            pos += 10 + ((3 << ((flags & 7) + 1)) if flags & 0x80 else 0) + 1
        else:
            pos += 2
        while data[pos]:
            pos += data[pos] + 1
        pos += 1
    return found


def _gif_with_huge_frame(left=0, top=0, side=65_535) -> bytes:
    data = _encode(photo(16, 16).convert("P"), "GIF", save_all=True, append_images=[photo(16, 16, seed=3).convert("P")])
    struct.pack_into("<HHHH", data, gif_descriptors(data)[-1] + 1, left, top, side, side)
    return bytes(data)


def _apng_with_huge_frame() -> bytes:
    data = _encode(photo(16, 16), "PNG", save_all=True, append_images=[photo(16, 16, seed=4)])
    fctl = data.rindex(b"fcTL")
    struct.pack_into(">II", data, fctl + 8, 100_000, 100_000)
    struct.pack_into(">I", data, fctl + 30, zlib.crc32(bytes(data[fctl : fctl + 30])))
    return bytes(data)


def _mpo_with_huge_frame() -> bytes:
    data = _encode(photo(16, 16), "MPO", save_all=True, append_images=[photo(16, 16, seed=5)])
    sof = data.rindex(b"\xff\xc0")  # the second frame's frame header
    struct.pack_into(">HH", data, sof + 5, 60_000, 60_000)
    return bytes(data)


def _icns_with_huge_icon() -> bytes:
    data = _encode(photo(64, 64, mode="RGBA"), "ICNS")
    first = data.index(b"\x89PNG\r\n\x1a\n")
    data[first : first + 33] = _png_claiming(data[first : first + 33], 100_000, 100_000)
    return bytes(data)


def psd(width: int = 12, height: int = 10) -> bytes:
    """A minimal valid Photoshop file (Pillow reads PSD but can't write it): RGB, raw channels."""
    pixels = photo(width, height).tobytes()
    planes = b"".join(pixels[c::3] for c in range(3))
    header = b"8BPS" + struct.pack(">H6xHIIHH", 1, 3, height, width, 8, 3)
    return header + struct.pack(">III", 0, 0, 0) + struct.pack(">H", 0) + planes


def _psd_field(offset: int, fmt: str, *values) -> bytes:
    data = bytearray(psd())
    struct.pack_into(fmt, data, offset, *values)
    return bytes(data)


def _tiff_without_width() -> bytes:
    data = _encode(photo(16, 16), "TIFF")
    ifd = struct.unpack_from("<I", data, 4)[0]
    for n in range(struct.unpack_from("<H", data, ifd)[0]):
        if struct.unpack_from("<H", data, ifd + 2 + 12 * n)[0] == 256:  # ImageWidth, renamed to a private tag
            struct.pack_into("<H", data, ifd + 2 + 12 * n, 65_000)
    return bytes(data)


def _png_with_text_bomb() -> bytes:
    """A zTXt chunk, before the image data, that inflates to 8 MB."""
    png = bytes(_encode(photo(16, 16), "PNG"))
    body = b"Comment\0\0" + zlib.compress(b"a" * (8 << 20), 9)
    chunk = struct.pack(">I", len(body)) + b"zTXt" + body + struct.pack(">I", zlib.crc32(b"zTXt" + body))
    at = png.index(b"IDAT") - 4
    return png[:at] + chunk + png[at:]


def _header_byte(fmt: str, offset: int, value: int, width: int = 1, order: str = "big") -> bytes:
    data = _encode(photo(16, 16), fmt)
    data[offset : offset + width] = value.to_bytes(width, order)
    return bytes(data)


def cases() -> dict:
    """{relpath: (bytes, expected reason or None)}; the label is the first folder."""
    wide = Image.new("L", (65_535, 1), 100)
    tall = Image.new("L", (1, 65_535), 200)
    return {
        "dds/flags_8.dds": (_dds(flags=8), images.DECODER_ERROR),
        "dds/fourcc_0.dds": (_dds(flags=4, fourcc=b"\0\0\0\0"), images.DECODER_ERROR),
        "dds/dxgi_93.dds": (_dds(flags=4, fourcc=b"DX10", dxgi=93), images.DECODER_ERROR),
        "dds/fourcc_unknown.dds": (_dds(flags=4, fourcc=b"ZZZZ"), images.DECODER_ERROR),
        "blp/blp2_encoding_7.blp": (_blp("BLP2", 8, 7), images.DECODER_ERROR),
        "blp/blp1_compression_5.blp": (_blp("BLP1", 4, 5, width=4), images.DECODER_ERROR),
        "wide/png_65535x1.png": (bytes(_encode(wide, "PNG")), None),
        "wide/png_1x65535.png": (bytes(_encode(tall, "PNG")), None),
        "wide/gif_65535x1.gif": (bytes(_encode(wide, "GIF")), None),
        "wide/gif_1x65535.gif": (bytes(_encode(tall, "GIF")), None),
        "tiff/webp_compression.tif": (_tiff_tag(259, 50001), images.CORRUPT),
        "tiff/zstd_bad_stream.tif": (_tiff_tag(259, 50000), images.CORRUPT),
        "tiff/jpeg2000_compression.tif": (_tiff_tag(259, 34712), images.DECODER_ERROR),
        "tiff/unknown_compression.tif": (_tiff_tag(259, 99), images.DECODER_ERROR),
        "tiff/65000_samples.tif": (_tiff_tag(277, 65_000), images.DECODER_ERROR),
        "tiff/9_samples_lzw.tif": (_tiff_tag(277, 9, compression="tiff_lzw"), images.DECODER_ERROR),
        "tiff/64_bits_per_sample.tif": (_tiff_tag(258, 64), images.DECODER_ERROR),
        "huge/ico_icon_100k.ico": (_ico_with_huge_icon(), images.TOO_MANY_PIXELS),
        "huge/tiff_page_60k.tif": (_tiff_with_huge_page(), images.TOO_MANY_PIXELS),
        "huge/gif_frame_65535.gif": (_gif_with_huge_frame(), images.TOO_MANY_PIXELS),
        "huge/gif_frame_placed_far.gif": (_gif_with_huge_frame(left=65_000, top=65_000, side=16), images.TOO_MANY_PIXELS),
        "huge/apng_frame_100k.png": (_apng_with_huge_frame(), images.TOO_MANY_PIXELS),
        "huge/mpo_frame_60k.jpg": (_mpo_with_huge_frame(), images.TOO_MANY_PIXELS),
        "huge/icns_icon_100k.icns": (_icns_with_huge_icon(), images.TOO_MANY_PIXELS),
        "ok/photoshop.psd": (psd(), None),
        # Found by reading Pillow's plugins for what they raise (OSError, SyntaxError, KeyError, TypeError, ValueError).
        "psd/rgb_with_1_channel.psd": (_psd_field(12, ">H", 1), images.CORRUPT),
        "psd/color_mode_99.psd": (_psd_field(24, ">H", 99), images.DECODER_ERROR),
        "psd/depth_7.psd": (_psd_field(22, ">H", 7), images.DECODER_ERROR),
        "huge/psd_100k.psd": (_psd_field(14, ">II", 100_000, 100_000), images.TOO_MANY_PIXELS),
        "tiff/no_width.tif": (_tiff_without_width(), images.DECODER_ERROR),
        "other/png_ztxt_bomb.png": (_png_with_text_bomb(), images.CORRUPT),
        "other/sgi_9_channels.sgi": (_header_byte("SGI", 10, 9, width=2), images.CORRUPT),
        "other/tga_type_7.tga": (_header_byte("TGA", 2, 7), images.NOT_AN_IMAGE),
    }
