"""One image's bytes in, the canonical image and its facts out, or a reject reason. Pillow only."""

import contextlib
import dataclasses
import hashlib
import io
import os
import time
import warnings
from struct import error as struct_error  # raised by a few plugins on absurd headers

import numpy as np
from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError

from beam_etl import containers

# Pillow's bomb check is off until canonicalise() sets it to --max_pixels (in _pillow), with its
# warning made an error. WARN_POSSIBLE_FORMATS: Image.open reports why each plugin refused a file.
Image.MAX_IMAGE_PIXELS = None
Image.WARN_POSSIBLE_FORMATS = True
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
DECODER_ERROR = "decoder_error"  # Pillow or a codec failed in a way none of the above names
TIMEOUT = "timeout"  # validation and encode ran past --image_timeout
WORKER_CRASHED = "worker_crashed"  # the encode process died on this input, alone (workpool.py)
REASONS = (EMPTY, NOT_AN_IMAGE, CORRUPT, TRUNCATED, TOO_MANY_PIXELS, TOO_LARGE, UNREADABLE, NO_LABEL, UNKNOWN_LABEL,
           DUPLICATE, DECODER_ERROR, TIMEOUT, WORKER_CRASHED)

DEFAULT_TIMEOUT_S = 30.0  # per image: validation and encode; --image_timeout

JPEG_MAX_SIDE = 65_500  # libjpeg's JPEG_MAX_DIMENSION: a larger image is stored as PNG
MAX_FRAMES = 10_000  # frames or pages a container may declare; past it, a reject


class TooHeavy(Exception):
    """An image whose size says its work may pass the memory given to work inline (canonicalise's inline_bytes)."""


def work_bytes(width: int, height: int) -> int:
    """What decoding and converting an image of this size may hold at once: a few 4-byte-per-pixel copies.

    Measured: a flat 9000x9000 RGBA PNG peaks at 1.3 GB (decode, alpha flattened, RGB copy, resize).
    """
    return 4 * 4 * width * height


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
    """Per-channel mean and mean of squares of an RGB or L image, over a STATS_SIDE copy."""
    # A box reduction is ~5x cheaper than a filtered resize and averages the same pixels. The
    # sums come from Pillow's histogram (one C pass); integer sums are exact in float64, so the
    # result equals a float64 mean over the pixels, at a tenth of the cost for a small copy.
    factor = max(1, min(im.width, im.height) // STATS_SIDE)
    small = im.reduce(factor) if factor > 1 else im
    counts = np.asarray(small.histogram(), dtype=np.float64).reshape(len(small.getbands()), 256)
    n = small.width * small.height
    return tuple((counts @ _LEVELS / n).tolist()), tuple((counts @ _SQUARES / n).tolist())


_LEVELS = np.arange(256, dtype=np.float64)
_SQUARES = _LEVELS**2


# Image formats Pillow can't open here but that are still images: a file named so is an input
# (then a reject with its reason), never mistaken for a stray non-image file.
_OTHER_IMAGE_EXTENSIONS = (".heic", ".heif", ".avif", ".jxl", ".svg", ".raw", ".dng", ".cr2", ".nef")


def may_be_image_name(name: str) -> bool:
    """False only for a file name whose extension no image format uses (labels.txt, meta.json)."""
    ext = os.path.splitext(name.rsplit("/", 1)[-1])[1].lower()
    return not ext or ext in Image.registered_extensions() or ext in _OTHER_IMAGE_EXTENSIONS


@contextlib.contextmanager
def _pillow(stage: str, source_format: str, max_pixels: int, keep_warnings: bool = False):
    """The boundary around Pillow's calls: whatever Pillow or a codec raises becomes a Rejected.

    Only Pillow calls (open, seek, load, EXIF, convert, resize, save) run inside it; our own
    logic runs outside, so a bug of ours still fails the tests. Pillow's own bomb check, which
    its plugins run on every sub-image (ICO, ICNS, GIF frames, TIFF tiles), is set to our limit.
    """
    Image.MAX_IMAGE_PIXELS = max_pixels  # the same value for every call of a run
    try:
        with warnings.catch_warnings(record=keep_warnings) as caught:
            warnings.simplefilter("always" if keep_warnings else "ignore")
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            yield caught
    except Rejected:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise Rejected(TOO_MANY_PIXELS, f"{source_format} {stage}: {e}") from None
    except UnidentifiedImageError:
        raise Rejected(NOT_AN_IMAGE, f"{stage}: not an image Pillow can read") from None
    except OSError as e:
        text = str(e)
        reason = TRUNCATED if "truncat" in text or "premature end" in text.lower() else CORRUPT
        raise Rejected(reason, f"{source_format} {stage} failed: {text}") from None
    except (ValueError, SyntaxError, IndexError, struct_error, EOFError, ZeroDivisionError) as e:
        raise Rejected(CORRUPT, f"{source_format} {stage} failed: {type(e).__name__}: {e}") from None
    except MemoryError:
        raise out_of_memory(f"{source_format} {stage}") from None
    except Exception as e:  # noqa: BLE001 - NotImplementedError, MemoryError, ... from any plugin
        raise Rejected(DECODER_ERROR, f"{source_format} {stage} failed: {type(e).__name__}: {e}") from None


def out_of_memory(what: str) -> Rejected:
    """The too_large reject of an image whose work failed an allocation: the limit and the size reached."""
    import resource

    caps = [resource.getrlimit(which)[0] for which in (resource.RLIMIT_DATA, resource.RLIMIT_AS)]  # ours, or the caller's
    limit = min((cap for cap in caps if cap != resource.RLIM_INFINITY), default=resource.RLIM_INFINITY)
    try:  # VmData: what RLIMIT_DATA counts, as it stands after the failed allocation
        with open("/proc/self/status") as f:
            reached = next(f"{int(line.split()[1]) >> 10:,} MB" for line in f if line.startswith("VmData:"))
    except (OSError, ValueError, StopIteration):  # no /proc (macOS)
        reached = "an unknown size"
    capped = f"a limit of {limit >> 20:,} MB per process (--image_memory_mb)" if limit != resource.RLIM_INFINITY else "the memory there is"
    return Rejected(TOO_LARGE, f"{what} ran out of memory: an allocation failed with the process at {reached} of data, "
                               f"against {capped}; raise --image_memory_mb if such images are wanted")


class _Clock:
    """A deadline for one image's work, checked at each read Pillow makes of its bytes and between steps."""

    SLOW_AFTER_S = 0.25  # past this, the decode reads SLOW_BLOCK bytes at a time, so checks come often
    SLOW_BLOCK = 1024

    def __init__(self, limit_s: float):
        self.started, self.limit_s, self.image = time.monotonic(), limit_s, None

    def check(self, stage: str) -> float:
        elapsed = time.monotonic() - self.started
        if elapsed > self.limit_s:
            raise Rejected(TIMEOUT, f"{stage} took {elapsed:.1f} s, over --image_timeout {self.limit_s:g} s")
        if elapsed > self.SLOW_AFTER_S and self.image is not None:
            # ImageFile.load reads decodermaxblock bytes per decode call (64 KB): one call over a
            # block of, say, thousands of tiny progressive scans can take seconds by itself.
            self.image.decodermaxblock = min(self.image.decodermaxblock, self.SLOW_BLOCK)
        return elapsed


class _TimedBytes(io.BytesIO):
    """The input's bytes as Pillow reads them: a read of a block (the decode's) checks the clock first.

    A header parser reads a few bytes at a time (~37 reads per photo): those check every 64th,
    which keeps the clock's cost per photo to a few microseconds.
    """

    def __init__(self, data: bytes, clock: _Clock):
        super().__init__(data)
        self.clock, self.small = clock, 0

    def read(self, size=-1):
        if size < 0 or size >= _Clock.SLOW_BLOCK:
            self.clock.check("decode")
        else:
            self.small += 1
            if not self.small & 63:
                self.clock.check("decode")
        return super().read(size)


def _open_timed(data: bytes, clock: _Clock) -> Image.Image:
    """Image.open on the bytes, the clock checked at each read; inside _pillow."""
    im = clock.image = Image.open(_TimedBytes(data, clock))
    if im.info.get("progressive"):  # each scan of a few bytes may go over the whole image again
        im.decodermaxblock = _Clock.SLOW_BLOCK
    return im


# Signatures no text or random file starts with: a file that has one but that no Pillow plugin
# opens is an image Pillow can't decode (a TIFF layout, a DDS pixel format), not "not an image".
_SIGNATURES = {b"II*\x00": "tiff", b"MM\x00*": "tiff", b"DDS ": "dds", b"BLP1": "blp", b"BLP2": "blp",
               b"8BPS": "psd", b"\x89PNG": "png", b"GIF8": "gif", b"\xff\xd8\xff": "jpeg", b"icns": "icns"}


def _open(data: bytes, max_pixels: int, clock: _Clock) -> Image.Image:
    if not data:
        raise Rejected(EMPTY, "the file is empty (0 bytes)")
    tried = []  # each plugin's failure, as Pillow reports it
    try:
        with _pillow("open", "input", max_pixels, keep_warnings=True) as tried:
            return _open_timed(data, clock)
    except Rejected as r:
        rejected = r
    if rejected.reason == NOT_AN_IMAGE:
        signature = next((name for magic, name in _SIGNATURES.items() if data.startswith(magic)), "")
        failures = [str(w.message) for w in tried if str(w.message).lower().startswith(f"{signature} opening failed")]
        if signature and failures:
            # JPEG, PNG and GIF Pillow reads in every variant: failing, they are damaged. The
            # others have layouts and codecs Pillow does not implement (TIFF, DDS, BLP, PSD).
            reason = CORRUPT if signature in ("jpeg", "png", "gif") else DECODER_ERROR
            raise Rejected(reason, f"a {signature} file Pillow can't open: {'; '.join(failures)[:300]}")
        raise Rejected(NOT_AN_IMAGE, f"not an image Pillow can read (starts with {data[:8]!r})")
    if rejected.reason in (CORRUPT, TRUNCATED):
        raise Rejected(CORRUPT, f"unreadable header: {rejected.message}")
    raise rejected


def _check_pixels(width: int, height: int, policy: Policy, what: str) -> None:
    if width <= 0 or height <= 0:
        raise Rejected(CORRUPT, f"bad size {width}x{height}{what}")
    if width * height > policy.max_pixels:
        raise Rejected(TOO_MANY_PIXELS, f"{width}x{height}{what} is over --max_pixels {policy.max_pixels}")


def _peek_orientation(im: Image.Image):
    """The EXIF orientation read from the header bytes, on a copy; None when they don't parse.

    On a copy, because Image.getexif() caches a half-parsed result after an error and would
    then hide that error from the decode step's own call.
    """
    raw = im.info.get("exif")
    if not raw:
        return 1
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exif = Image.Exif()
            exif.load(raw)
            return exif.get(0x0112, 1)
    except Exception:  # noqa: BLE001 - any parse failure: the full decode reports it, as before
        return None


def _scaled_decode_fits(im: Image.Image, source_format: str, target_mode: str, policy: Policy, needs_resize: bool) -> bool:
    """A JPEG that will pass through untouched: validating it needs no full-size pixels."""
    return (
        source_format == "jpeg"
        and im.mode == target_mode
        and not needs_resize
        and not policy.pixel_hash  # --dedup keys on the full decode's pixels
        and _peek_orientation(im) == 1
    )


def canonicalise(data: bytes, policy: Policy = Policy(), scaled: bool = True, timeout_s: float = DEFAULT_TIMEOUT_S, inline_bytes: int = 0) -> Canonical:
    """Validate `data` by decoding it completely and return its canonical form; raise Rejected.

    timeout_s: the work past it is a TIMEOUT reject, found at the decode's next read of the
    input (a block of 64 KB, then 1 KB after SLOW_AFTER_S) or at the next step: so a time bomb
    costs the limit plus at most one block's decode, with no thread or signal (a Beam worker's).
    inline_bytes: TooHeavy when work_bytes of the image (from its header) is over it; 0: no check.

    scaled: a JPEG that passes through is decoded at 1/8 scale (libjpeg's DCT scaling). libjpeg
    still parses every marker and entropy-decodes every coefficient of every scan, so damage is
    found as in a full decode (tests/test_scaled_decode.py proves the same verdicts over a
    damaged corpus); it skips most of the IDCT, upsampling and colour conversion.
    """
    clock = _Clock(timeout_s)
    im = _open(data, policy.max_pixels, clock)
    source_format = (im.format or "unknown").lower()
    width, height = im.size
    _check_pixels(width, height, policy, "")
    if inline_bytes and work_bytes(width, height) > inline_bytes:
        raise TooHeavy(f"{width}x{height}")
    with _pillow("header", source_format, policy.max_pixels):  # Rejected passes through it as is
        for count, (w, h, what) in enumerate(containers.declared_sizes(im, data)):  # headers only, no pixels
            if count >= MAX_FRAMES:
                raise Rejected(TOO_MANY_PIXELS, f"{source_format} declares over {MAX_FRAMES} frames or sub-images")
            _check_pixels(w, h, policy, f" ({what})")
    target_mode = "RGB" if policy.channels == 3 else "L"
    needs_resize = bool(policy.max_side and max(width, height) > policy.max_side)
    scaled = scaled and _scaled_decode_fits(im, source_format, target_mode, policy, needs_resize)
    compression = im.info.get("compression")  # TIFF: a codec this build may lack (webp, jpeg2000)
    with _pillow(f"decode ({compression} compression)" if compression else "decode", source_format, policy.max_pixels):
        if scaled:
            im.draft(im.mode, (max(1, width // 8), max(1, height // 8)))
        im.load()  # every scan decoded: truncated and corrupt data fail here
        orientation = im.getexif().get(0x0112, 1)

    passthrough = (
        source_format == "jpeg"
        and im.mode == target_mode
        and orientation in (1, None)
        and not needs_resize
    )
    if scaled and not passthrough:  # say, an orientation only XMP declared: it is re-encoded, at full size
        with _pillow("decode", source_format, policy.max_pixels):
            im = _open_timed(data, clock)
            im.load()
    clock.check(f"{source_format} decode")
    with _pillow("conversion", source_format, policy.max_pixels):
        if orientation not in (1, None):
            im = ImageOps.exif_transpose(im)  # animated inputs keep their first frame
        im = _to_mode(im, policy.channels)
        if needs_resize:
            im.thumbnail((policy.max_side, policy.max_side), Image.LANCZOS)

    if passthrough:
        out, fmt = data, "jpeg"
    else:
        # JPEG holds at most 65,500 px a side: such an image is stored losslessly as PNG instead.
        fmt = "png" if policy.image_format == "png" or max(im.size) > JPEG_MAX_SIDE else "jpeg"
        buf = io.BytesIO()
        with _pillow("encode", source_format, policy.max_pixels):
            if fmt == "jpeg":
                im.save(buf, "JPEG", quality=policy.jpeg_quality)
            else:
                im.save(buf, "PNG")
        out = buf.getvalue()
    clock.check(f"{source_format} conversion and encode")
    with _pillow("statistics", source_format, policy.max_pixels):
        mean, sq_mean = _stats(im)
        pixels = im.tobytes() if policy.pixel_hash else b""
    return Canonical(
        data=out,
        format=fmt,
        height=height if passthrough else im.height,  # a scaled decode's pixels are 1/8 of the stored size
        width=width if passthrough else im.width,
        channels=policy.channels,
        source_format=source_format,
        passthrough=passthrough,
        sha256=hashlib.sha256(out).hexdigest(),
        pixel_mean=mean,
        pixel_sq_mean=sq_mean,
        pixel_sha256=hashlib.sha256(pixels).hexdigest() if policy.pixel_hash else "",
    )
