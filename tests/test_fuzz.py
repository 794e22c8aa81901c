"""Random and mutated bytes into the per-image function: always a record or a reject reason."""

import datetime

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beam_etl import images
from beam_etl.images import Policy, Rejected, canonicalise
from tests import corpus, hostile

SEEDS = [
    corpus.jpeg(40, 30),
    corpus.jpeg(40, 30, progressive=True),
    corpus.encode(corpus.photo(20, 20, mode="RGBA"), "PNG"),
    corpus.encode(corpus.photo(20, 20, mode="P"), "GIF"),
    corpus.encode(corpus.photo(20, 20), "BMP"),
    corpus.encode(corpus.photo(20, 20), "WEBP"),
    corpus.encode(corpus.photo(20, 20), "TIFF"),
    corpus.png16_gray(16, 8),
    corpus.exif_rotated_jpeg(3, 24, 16),
    # Every other format Pillow opens here, written by Pillow or (PSD) by hand.
    corpus.encode(corpus.photo(16, 16), "DDS"),
    corpus.encode(corpus.photo(32, 32, mode="RGBA"), "ICNS"),
    corpus.encode(corpus.photo(32, 32, mode="RGBA"), "ICO", sizes=[(16, 16), (32, 32)]),
    hostile.psd(),
    corpus.encode(corpus.photo(16, 16), "TIFF", compression="tiff_lzw"),
    corpus.encode(corpus.photo(16, 16), "TIFF", save_all=True, append_images=[corpus.photo(8, 8)]),
    corpus.encode(corpus.photo(16, 16).convert("P"), "BLP"),
    corpus.encode(corpus.photo(16, 16), "TGA"),
    corpus.encode(corpus.photo(16, 16), "PCX"),
    corpus.encode(corpus.photo(16, 16), "SGI"),
    corpus.encode(corpus.photo(16, 16), "WEBP", save_all=True, append_images=[corpus.photo(16, 16, seed=2)]),
    corpus.encode(corpus.photo(16, 16), "PNG", save_all=True, append_images=[corpus.photo(16, 16, seed=3)]),
    corpus.encode(corpus.photo(16, 16).convert("P"), "GIF", save_all=True, append_images=[corpus.photo(16, 16, seed=4).convert("P")]),
    corpus.encode(corpus.photo(16, 16), "MPO", save_all=True, append_images=[corpus.photo(16, 16, seed=5)]),
    corpus.encode(corpus.photo(16, 16), "JPEG2000"),
    corpus.encode(corpus.photo(16, 16), "QOI"),
    corpus.encode(corpus.photo(16, 16), "PPM"),
]
# A hang guard, not a speed claim: one small image must never take this long.
FUZZ = settings(max_examples=400, deadline=datetime.timedelta(seconds=20), suppress_health_check=[HealthCheck.too_slow], derandomize=True)


def check(data: bytes) -> None:
    policy = Policy(max_pixels=4_000_000)
    try:
        out = canonicalise(data, policy)
    except Rejected as r:
        assert r.reason in images.REASONS and r.message
        return
    assert out.data and out.height > 0 and out.width > 0 and out.channels == 3
    assert canonicalise(out.data, policy).format == "jpeg"  # what we store is itself valid


@FUZZ
@given(st.binary(max_size=2048))
def test_random_bytes(data):
    check(data)


@FUZZ
@given(st.sampled_from(SEEDS), st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=8), st.integers(0, 10**6))
def test_mutated_images(seed, flips, cut):
    data = bytearray(seed)
    for position, value in flips:
        data[position % len(data)] = value
    check(bytes(data[: max(1, cut % (len(data) + 1))]))


@FUZZ
@given(st.sampled_from(SEEDS), st.binary(min_size=1, max_size=64), st.integers(0, 10**6))
def test_spliced_images(seed, junk, position):
    at = position % len(seed)
    check(seed[:at] + junk + seed[at:])
