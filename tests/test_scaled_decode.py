"""The scaled JPEG decode is exactly as strict as the full one: same verdict and reason on every damaged file."""

import collections
import hashlib

import pytest

from beam_etl import images
from beam_etl.images import Policy, Rejected
from tests import damaged_jpegs


def _verdict(data: bytes, policy: Policy, scaled: bool):
    try:
        out = images.canonicalise(data, policy, scaled=scaled)
    except Rejected as r:
        return ("rejected", r.reason)
    return ("written", hashlib.sha256(out.data).hexdigest(), out.height, out.width, out.passthrough)


@pytest.fixture(scope="module")
def corpus():
    return damaged_jpegs.corpus()


def test_the_corpus_has_every_kind_of_damage_and_enough_files(corpus):
    assert len(corpus) >= 2000
    kinds = " ".join(description for description, _ in corpus)
    for needle in ("truncated at 2%", "truncated at 98%", "bit flip in the headers", "bit flip in the scan data",
                   "burst in the headers", "burst in the scan data", "SOI removed", "SOF0 removed", "SOF2 removed",
                   "DHT removed", "DQT removed", "SOS removed", "DRI removed", "RST at", "EOI removed",
                   "bytes after EOI", "fake marker ffd9", "progressive", "restart_markers", "cmyk", "grayscale",
                   "baseline_444", "baseline_420"):
        assert needle in kinds, needle


@pytest.mark.parametrize("channels", [3, 1])
def test_every_damaged_jpeg_gets_the_full_decodes_verdict(corpus, channels):
    policy = Policy(channels=channels)
    differ, tally = [], collections.Counter()
    for description, data in corpus:
        full, fast = _verdict(data, policy, scaled=False), _verdict(data, policy, scaled=True)
        tally[full[0] if full[0] == "written" else full[1]] += 1
        if full != fast:
            differ.append(f"{description}: full {full}, scaled {fast}")
    assert not differ, f"{len(differ)} of {len(corpus)} differ:\n" + "\n".join(differ[:20])
    # The corpus exercises both outcomes, and more than one reason.
    assert tally["written"] > 100 and sum(n for k, n in tally.items() if k != "written") > 500, tally


def test_a_pass_through_jpeg_is_validated_at_one_eighth_and_keeps_its_full_size():
    data = damaged_jpegs.sources()["baseline_420"]
    fast = images.canonicalise(data, Policy(), scaled=True)
    full = images.canonicalise(data, Policy(), scaled=False)
    assert fast.passthrough and fast.data == data and (fast.height, fast.width) == (full.height, full.width) == (152, 200)
    # The statistics copy comes from the 1/8 image: close to the full decode's, not equal.
    assert fast.pixel_mean == pytest.approx(full.pixel_mean, abs=3.0)


def test_what_is_re_encoded_or_deduplicated_keeps_the_full_decode():
    sources = damaged_jpegs.sources()
    cmyk = images.canonicalise(sources["cmyk"], Policy(), scaled=True)
    assert not cmyk.passthrough and (cmyk.height, cmyk.width) == (152, 200)
    dedup = Policy(pixel_hash=True)
    assert images.canonicalise(sources["baseline_420"], dedup, scaled=True).pixel_sha256 == \
        images.canonicalise(sources["baseline_420"], dedup, scaled=False).pixel_sha256
    resized = images.canonicalise(sources["baseline_420"], Policy(max_side=100), scaled=True)
    assert max(resized.height, resized.width) == 100 and not resized.passthrough


def test_the_other_corpora_s_jpegs_get_the_same_verdicts(tmp_path):
    """The robustness and hostile corpora (made by other generators: EXIF rotations, bombs, odd
    headers), and their own damaged copies, through both paths."""
    from tests import corpus, hostile

    corpus.robustness_corpus(tmp_path)
    files = [p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()]
    files += [data for data, _ in hostile.cases().values()]
    jpegs = [data for data in files if data[:3] == b"\xff\xd8\xff"]
    assert len(jpegs) >= 10
    variants = []
    for data in jpegs:
        variants.append(data)
        variants += [data[: len(data) * p // 10] for p in range(1, 10)]
        variants += [data[:i] + bytes([data[i] ^ 0x10]) + data[i + 1 :] for i in range(2, len(data), max(1, len(data) // 15))]
    for channels in (3, 1):
        policy = Policy(channels=channels, max_pixels=50_000_000)
        differ = [i for i, v in enumerate(variants) if _verdict(v, policy, False) != _verdict(v, policy, True)]
        assert not differ, f"{len(differ)} of {len(variants)} differ, first: {variants[differ[0]][:40]!r}"
