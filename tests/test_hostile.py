"""Every bad file is a reject with a known reason, never a failed job (issue 23).

The per-image checks run in a child process under an address-space cap, so that a wrong guess
about a hostile file fails the test instead of taking the machine down.
"""

import json
import os
import subprocess
import sys

import pytest

from beam_etl import images
from tests import hostile
from tests.conftest import ROOT, run_convert

CAP_BYTES = 3 * 1024**3

CHECK_ALL = r"""
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]), int(sys.argv[1])))
from PIL import Image
import io
from beam_etl import images
from tests import hostile
out = {}
for rel, (data, _) in hostile.cases().items():
    try:
        canon = images.canonicalise(data)
        stored = Image.open(io.BytesIO(canon.data))
        out[rel] = {"reason": None, "format": canon.format, "stored": [stored.format, *stored.size]}
    except images.Rejected as r:
        out[rel] = {"reason": r.reason, "message": r.message}
print(json.dumps(out))
"""


def _child(code, *args, cap=CAP_BYTES):
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-c", code, str(cap), *map(str, args)], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def outcomes():
    return _child(CHECK_ALL)


@pytest.mark.parametrize("rel", sorted(hostile.cases()))
def test_each_case_gets_its_reason(outcomes, rel):
    expected = hostile.cases()[rel][1]
    got = outcomes[rel]
    assert got["reason"] == expected, got
    if expected is not None:
        assert got["message"] and "\n" not in got["message"]


def test_unimplemented_formats_name_the_exception(outcomes):
    assert "NotImplementedError: Unimplemented DXGI format 93" in outcomes["dds/dxgi_93.dds"]["message"]
    assert "Unknown pixel format flags 8" in outcomes["dds/flags_8.dds"]["message"]
    assert "BLPFormatError" in outcomes["blp/blp2_encoding_7.blp"]["message"]
    assert "samples per pixel" in outcomes["tiff/65000_samples.tif"]["message"]


@pytest.mark.parametrize("rel", ["wide/png_65535x1.png", "wide/png_1x65535.png", "wide/gif_65535x1.gif", "wide/gif_1x65535.gif"])
def test_sides_over_65500_are_stored_as_png(outcomes, rel):
    got = outcomes[rel]
    assert got["format"] == "png" and got["stored"][0] == "PNG"
    assert sorted(got["stored"][1:]) == [1, 65_535]


def test_sides_over_65500_are_resized_with_max_side():
    canon = images.canonicalise(hostile.cases()["wide/png_65535x1.png"][0], images.Policy(max_side=4096))
    assert canon.format == "jpeg" and canon.width == 4096 and canon.height == 1


def test_a_plain_policy_still_says_jpeg_for_ordinary_sizes():
    canon = images.canonicalise(hostile.psd(), images.Policy())
    assert canon.format == "jpeg" and canon.source_format == "psd" and (canon.width, canon.height) == (12, 10)


MEMORY = r"""
import io, json, resource, sys
from PIL import Image
buf = io.BytesIO()
Image.new("1", (40_000, 40_000)).save(buf, "PNG")  # 1.6 billion pixels in a few hundred KB
data = buf.getvalue()
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]), int(sys.argv[1])))
from beam_etl import images
try:
    images.canonicalise(data, images.Policy(max_pixels=2_000_000_000))
    print(json.dumps({"reason": None}))
except images.Rejected as r:
    print(json.dumps({"reason": r.reason, "message": r.message}))
"""


def test_memory_error_is_a_reject():
    """Past --max_pixels raised on purpose: the decode can't get its 1.6 GB under a 1 GB cap."""
    got = _child(MEMORY, cap=1024**3)
    assert got["reason"] == images.TOO_LARGE and "ran out of memory" in got["message"] and "a limit of 1,024 MB" in got["message"], got


def _folder(root):
    cases = hostile.cases()
    for rel, (data, _) in cases.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return {rel: reason for rel, (_, reason) in cases.items()}


@pytest.mark.parametrize("processes", ["2", "0"])  # 2: the pool, which a folder this small gets only when asked for
def test_conversion_of_every_case_reconciles(tmp_path, processes):
    """Through the real converter: every input is written or rejected with its reason."""
    expected = _folder(tmp_path / "in")
    out = tmp_path / "ds"
    run_convert("--input", tmp_path / "in", "--output", out, "--max_reject_fraction", "1.0", "--num_shards", "2",
                "--encode_processes", processes)
    document = json.loads((out / "dataset.json").read_text())
    written = sum(split["examples"] for split in document["splits"].values())
    assert document["inputs"] == len(expected) == written + document["rejected"]["total"]
    rejects = {row["key"]: row["reason"] for row in map(json.loads, (out / "rejected.jsonl").read_text().splitlines())}
    assert rejects == {rel: reason for rel, reason in expected.items() if reason is not None}
    assert written == sum(reason is None for reason in expected.values())
