"""One image's bytes in, the canonical image and its facts out, or a reject reason. Pillow only."""

import dataclasses
import hashlib
import io
import os
import warnings
from struct import error as struct_error  # raised by a few plugins on absurd headers

import numpy as np
from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError

# Pillow's own bomb check is a warning below 2x its limit; ours is an explicit, configurable one.
Image.MAX_IMAGE_PIXELS = None
ImageFile.LOAD_TRUNCATED_IMAGES = False

STATS_SIDE = 32  # statistics are taken on a copy about this size, not on the full image

# Reason codes, also the keys of the reject counts in dataset.json.
EMPTY = "empty"
NOT_AN_IMAGE = "not_an_image"
CORRUPT = "corrupt"
TRUNCATED = "truncated"
TOO_MANY_PIXELS = "too_many_pixels"
TOO_LARGE = "too_large"
UNREADABLE = "unreadable"
NO_LABEL = "no_label"
UNKNOWN_LABEL = "unknown_label"
DUPLICATE = "duplicate"
REASONS = (EMPTY, NOT_AN_IMAGE, CORRUPT, TRUNCATED, TOO_MANY_PIXELS, TOO_LARGE, UNREADABLE, NO_LABEL, UNKNOWN_LABEL, DUPLICATE)


class Rejected(Exception):
    """An input that cannot become a record; carries a reason code and a message."""

    def __init__(self, reason: str, message: str):
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


@dataclasses.dataclass(frozen=True)
class Policy:
    """The canonicalisation policy; see README 'Canonical images'."""

    channels: int = 3  # 3: RGB, 1: grayscale
    image_format: str = "jpeg"  # what re-encoded images are stored as: jpeg or png
    jpeg_quality: int = 95
    max_side: int = 0  # 0: keep the size; else downsize so the longer side is at most this
    max_pixels: int = 100_000_000  # refuse larger images before decoding them
    pixel_hash: bool = False  # hash the decoded pixels (for --dedup); costs a pass over them

    def __post_init__(self):
        if self.channels not in (1, 3):
            raise ValueError(f"channels must be 1 or 3, not {self.channels!r}")
        if self.image_format not in ("jpeg", "png"):
            raise ValueError(f"image_format must be jpeg or png, not {self.image_format!r}")
        if not 1 <= self.jpeg_quality <= 100:
            raise ValueError(f"jpeg_quality must be in 1..100, not {self.jpeg_quality!r}")
        if self.max_side < 0 or self.max_pixels <= 0:
            raise ValueError("max_side must be >= 0 and max_pixels > 0")


@dataclasses.dataclass(frozen=True)
class Canonical:
    """A canonical image: the bytes to store and facts that describe them exactly."""

    data: bytes
    format: str  # "jpeg" or "png": the format of `data`
    height: int
    width: int
    channels: int
    source_format: str  # what the input really was, from its bytes
    passthrough: bool  # True when `data` is the input, untouched
    sha256: str  # of `data`
    pixel_mean: tuple  # per channel, 0..255, over a STATS_SIDE copy
    pixel_sq_mean: tuple  # per channel mean of squares, for the standard deviation
    pixel_sha256: str  # of the decoded canonical pixels when Policy.pixel_hash, else ''


def _to_8bit(im: Image.Image) -> Image.Image:
    """16- and 32-bit integer or float modes to 8-bit L, scaled rather than clipped."""
    arr = np.asarray(im)
    if im.mode.startswith("I;16") or (im.mode == "I" and arr.max(initial=0) > 255):
        arr = np.clip(np.rint(arr.astype(np.float64) / 257.0), 0, 255)
    elif im.mode == "F" and arr.size and 0.0 <= arr.min() and arr.max() <= 1.0:
        arr = arr * 255.0
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8), "L")


def _flatten_alpha(im: Image.Image) -> Image.Image:
    """Composite any transparency over white, so transparent pixels don't turn black."""
    if im.mode == "P" and "transparency" in im.info:
        im = im.convert("RGBA")
    if im.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = im.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        im = Image.alpha_composite(background, rgba)
    return im


def _to_mode(im: Image.Image, channels: int) -> Image.Image:
    if im.mode.startswith("I") or im.mode == "F":
        im = _to_8bit(im)
    im = _flatten_alpha(im)
    target = "RGB" if channels == 3 else "L"
    return im if im.mode == target else im.convert(target)


def _stats(im: Image.Image):
    # A box reduction is ~5x cheaper than a filtered resize and averages the same pixels.
    factor = max(1, min(im.width, im.height) // STATS_SIDE)
    small = np.asarray(im.reduce(factor) if factor > 1 else im, dtype=np.float64)
    small = small.reshape(-1, 1 if small.ndim == 2 else small.shape[-1])
    return tuple(small.mean(axis=0).tolist()), tuple((small**2).mean(axis=0).tolist())


# Image formats Pillow can't open here but that are still images: a file named so is an input
# (then a reject with its reason), never mistaken for a stray non-image file.
_OTHER_IMAGE_EXTENSIONS = (".heic", ".heif", ".avif", ".jxl", ".svg", ".raw", ".dng", ".cr2", ".nef")


def may_be_image_name(name: str) -> bool:
    """False only for a file name whose extension no image format uses (labels.txt, meta.json)."""
    ext = os.path.splitext(name.rsplit("/", 1)[-1])[1].lower()
    return not ext or ext in Image.registered_extensions() or ext in _OTHER_IMAGE_EXTENSIONS


def _open(data: bytes) -> Image.Image:
    if not data:
        raise Rejected(EMPTY, "the file is empty (0 bytes)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return Image.open(io.BytesIO(data))
    except UnidentifiedImageError:
        raise Rejected(NOT_AN_IMAGE, f"not an image Pillow can read (starts with {data[:8]!r})") from None
    except (OSError, ValueError, SyntaxError, struct_error, Image.DecompressionBombError) as e:
        raise Rejected(CORRUPT, f"unreadable header: {e}") from None


def canonicalise(data: bytes, policy: Policy = Policy()) -> Canonical:
    """Validate `data` by decoding it completely and return its canonical form; raise Rejected."""
    im = _open(data)
    source_format = (im.format or "unknown").lower()
    width, height = im.size
    if width <= 0 or height <= 0:
        raise Rejected(CORRUPT, f"bad size {width}x{height}")
    if width * height > policy.max_pixels:
        raise Rejected(TOO_MANY_PIXELS, f"{width}x{height} is over --max_pixels {policy.max_pixels}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            im.load()  # a full decode: truncated and corrupt data fail here
            orientation = im.getexif().get(0x0112, 1)
    except OSError as e:
        text = str(e)
        reason = TRUNCATED if "truncat" in text or "premature end" in text.lower() else CORRUPT
        raise Rejected(reason, f"{source_format} decode failed: {text}") from None
    except (ValueError, SyntaxError, IndexError, TypeError, struct_error, EOFError, ZeroDivisionError, MemoryError) as e:
        raise Rejected(CORRUPT, f"{source_format} decode failed: {type(e).__name__}: {e}") from None

    target_mode = "RGB" if policy.channels == 3 else "L"
    needs_resize = policy.max_side and max(width, height) > policy.max_side
    passthrough = (
        source_format == "jpeg"
        and im.mode == target_mode
        and orientation in (1, None)
        and not needs_resize
    )
    try:
        if orientation not in (1, None):
            im = ImageOps.exif_transpose(im)  # animated inputs keep their first frame
        im = _to_mode(im, policy.channels)
        if needs_resize:
            im.thumbnail((policy.max_side, policy.max_side), Image.LANCZOS)
    except (OSError, ValueError, TypeError) as e:
        raise Rejected(CORRUPT, f"{source_format} conversion failed: {e}") from None

    if passthrough:
        out, fmt = data, "jpeg"
    else:
        buf = io.BytesIO()
        if policy.image_format == "jpeg":
            im.save(buf, "JPEG", quality=policy.jpeg_quality)
        else:
            im.save(buf, "PNG")
        out, fmt = buf.getvalue(), policy.image_format
    mean, sq_mean = _stats(im)
    return Canonical(
        data=out,
        format=fmt,
        height=im.height,
        width=im.width,
        channels=policy.channels,
        source_format=source_format,
        passthrough=passthrough,
        sha256=hashlib.sha256(out).hexdigest(),
        pixel_mean=mean,
        pixel_sq_mean=sq_mean,
        pixel_sha256=hashlib.sha256(im.tobytes()).hexdigest() if policy.pixel_hash else "",
    )
