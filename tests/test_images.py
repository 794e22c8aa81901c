"""The per-image function, one case per format and per broken file."""

import hashlib
import io

import numpy as np
import pytest
from PIL import Image

from beam_etl import images
from beam_etl.images import Policy, Rejected, canonicalise
from tests import corpus


def decoded(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)))


def test_baseline_jpeg_passes_through_untouched():
    data = corpus.jpeg(80, 60)
    out = canonicalise(data)
    assert out.passthrough and out.data == data and out.format == "jpeg"
    assert (out.height, out.width, out.channels) == (60, 80, 3)
    assert out.sha256 == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("mode,size", [("RGB", (54, 45)), ("RGB", (700, 333)), ("L", (31, 1)), ("L", (640, 480))])
def test_statistics_equal_a_float64_mean_over_the_reduced_copy(mode, size):
    rng = np.random.default_rng(sum(size))
    shape = size[::-1] + ((3,) if mode == "RGB" else ())
    im = Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode)
    factor = max(1, min(size) // images.STATS_SIDE)
    small = np.asarray(im.reduce(factor) if factor > 1 else im, dtype=np.float64).reshape(-1, len(mode))
    mean, sq_mean = images._stats(im)
    assert mean == tuple(small.mean(axis=0).tolist())
    assert sq_mean == tuple((small**2).mean(axis=0).tolist())


def test_progressive_jpeg_passes_through():
    data = corpus.jpeg(80, 60, progressive=True)
    out = canonicalise(data)
    assert out.passthrough and out.data == data and out.source_format == "jpeg"


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "P", "L"])
def test_png_modes_become_8bit_rgb_jpeg(mode):
    image = corpus.photo(40, 30, mode=mode)
    out = canonicalise(corpus.encode(image, "PNG"))
    assert not out.passthrough and out.format == "jpeg" and out.source_format == "png"
    assert decoded(out.data).shape == (30, 40, 3)


def test_rgba_transparency_is_composited_over_white():
    image = Image.new("RGBA", (8, 8), (255, 0, 0, 0))  # fully transparent red
    out = canonicalise(corpus.encode(image, "PNG"), Policy(image_format="png"))
    assert (decoded(out.data) == 255).all()


def test_png_output_is_lossless():
    image = corpus.photo(40, 30)
    out = canonicalise(corpus.encode(image, "PNG"), Policy(image_format="png"))
    assert out.format == "png"
    np.testing.assert_array_equal(decoded(out.data), np.asarray(image))


def test_16bit_png_is_scaled_not_clipped():
    data = corpus.png16_gray()
    source = np.asarray(Image.open(io.BytesIO(data))).astype(np.float64)
    out = canonicalise(data, Policy(channels=1, image_format="png"))
    pixels = decoded(out.data)
    assert pixels.dtype == np.uint8 and pixels.shape == (16, 32)
    np.testing.assert_allclose(pixels, np.rint(source / 257.0), atol=1)
    assert pixels.max() == 255 and len(np.unique(pixels)) > 200  # clipping would saturate most at 255


def test_grayscale_png_with_one_channel():
    out = canonicalise(corpus.encode(corpus.photo(20, 10, mode="L"), "PNG"), Policy(channels=1))
    assert out.channels == 1 and decoded(out.data).shape == (10, 20)


def test_grayscale_jpeg_passes_through_with_one_channel_only():
    data = corpus.encode(corpus.photo(20, 10, mode="L"), "JPEG")
    assert canonicalise(data, Policy(channels=1)).passthrough
    as_rgb = canonicalise(data, Policy(channels=3))
    assert not as_rgb.passthrough and decoded(as_rgb.data).shape == (10, 20, 3)


@pytest.mark.parametrize("fmt", ["GIF", "BMP", "WEBP"])
def test_other_formats(fmt):
    out = canonicalise(corpus.encode(corpus.photo(33, 17), fmt))
    assert out.source_format == fmt.lower() and not out.passthrough
    assert decoded(out.data).shape == (17, 33, 3)


def test_cmyk_jpeg_is_converted_to_rgb():
    data = corpus.encode(corpus.photo(30, 20, mode="CMYK"), "JPEG")
    out = canonicalise(data)
    assert not out.passthrough and decoded(out.data).shape == (20, 30, 3)


def test_exif_orientation_is_applied():
    out = canonicalise(corpus.exif_rotated_jpeg(6, width=64, height=48))
    assert not out.passthrough
    assert (out.width, out.height) == (48, 64)  # rotated a quarter turn
    assert Image.open(io.BytesIO(out.data)).getexif().get(0x0112, 1) == 1


def test_max_side_keeps_aspect_ratio():
    out = canonicalise(corpus.jpeg(200, 100), Policy(max_side=50))
    assert (out.width, out.height) == (50, 25) and not out.passthrough


def test_statistics_describe_the_pixels():
    image = Image.new("RGB", (16, 16), (10, 20, 30))
    out = canonicalise(corpus.encode(image, "PNG"))
    np.testing.assert_allclose(out.pixel_mean, (10, 20, 30), atol=2)
    np.testing.assert_allclose(out.pixel_sq_mean, np.square(out.pixel_mean), rtol=0.02)


def test_pixel_hash_only_when_asked():
    data = corpus.jpeg()
    assert canonicalise(data).pixel_sha256 == ""
    assert canonicalise(data, Policy(pixel_hash=True)).pixel_sha256 == canonicalise(corpus.jpeg(), Policy(pixel_hash=True)).pixel_sha256


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"", images.EMPTY),
        (b"this is not an image, just text named like one\n", images.NOT_AN_IMAGE),
        (b"<html><body>404</body></html>", images.NOT_AN_IMAGE),
        (corpus.bomb_png(), images.TOO_MANY_PIXELS),
    ],
    ids=["zero-bytes", "text", "html", "bomb"],
)
def test_bad_inputs_are_rejected_with_a_reason(data, reason):
    with pytest.raises(Rejected) as info:
        canonicalise(data)
    assert info.value.reason == reason and info.value.message


@pytest.mark.parametrize("keep", [0.3, 0.6, 0.9])
def test_truncated_jpeg_is_rejected(keep):
    data = corpus.jpeg(120, 90)
    with pytest.raises(Rejected) as info:
        canonicalise(data[: int(len(data) * keep)])
    assert info.value.reason in (images.TRUNCATED, images.CORRUPT)


def test_truncated_png_is_rejected():
    data = corpus.encode(corpus.photo(60, 40), "PNG")
    with pytest.raises(Rejected) as info:
        canonicalise(data[: len(data) // 2])
    assert info.value.reason in (images.TRUNCATED, images.CORRUPT)


def test_pixel_limit_is_configurable():
    with pytest.raises(Rejected) as info:
        canonicalise(corpus.jpeg(100, 100), Policy(max_pixels=9_999))
    assert info.value.reason == images.TOO_MANY_PIXELS and "9999" in info.value.message


def test_policy_rejects_bad_settings():
    with pytest.raises(ValueError, match="channels"):
        Policy(channels=2)
    with pytest.raises(ValueError, match="image_format"):
        Policy(image_format="tiff")


def test_stored_facts_match_what_tensorflow_decodes():
    tf = pytest.importorskip("tensorflow")
    cases = [
        (corpus.jpeg(), Policy()),
        (corpus.encode(corpus.photo(mode="RGBA"), "PNG"), Policy(image_format="png")),
        (corpus.encode(corpus.photo(mode="L"), "PNG"), Policy(channels=1)),
        (corpus.exif_rotated_jpeg(8), Policy()),
        (corpus.png16_gray(), Policy(channels=1, image_format="png")),
    ]
    for data, policy in cases:
        out = canonicalise(data, policy)
        assert tuple(tf.io.decode_image(out.data).shape) == (out.height, out.width, out.channels)
