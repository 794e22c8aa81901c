"""Bounded time and memory per image, and pool processes that die: each costs one input, never the job."""

import collections
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from beam_etl import images, records, verify, workpool
from beam_etl.sources import ImageRef
from tests import bombs
from tests.conftest import ROOT, run_convert
from tests.corpus import encode, jpeg, make_folder, photo

GOOD = 5000
LIMITS = ["--image_timeout", "2", "--image_memory_mb", "1024"]
BAD = {  # the inputs each conversion below rejects, by reason
    "ant/zz_time_bomb.jpg": "timeout",
    "bee/zz_memory_bomb.png": "too_large",
    "cow/zz_crash_kill.png": "worker_crashed",
    "cow/zz_crash_segv.png": "worker_crashed",
}


@pytest.fixture(scope="module")
def bomb_files():
    return {"ant/zz_time_bomb.jpg": bombs.progressive_time_bomb(), "bee/zz_memory_bomb.png": bombs.memory_bomb(),
            "cow/zz_crash_kill.png": bombs.crash_file("SIGKILL"), "cow/zz_crash_segv.png": bombs.crash_file("SIGSEGV")}


@pytest.fixture(scope="module")
def hostile_folder(tmp_path_factory, bomb_files):
    """5,000 good images in three classes, a time bomb, a memory bomb and two files that crash their decoder."""
    root = tmp_path_factory.mktemp("hostile") / "images"
    good = {}
    for i in range(GOOD):  # small photos of a few sizes, a quarter of them PNG
        label = ("ant", "bee", "cow")[i % 3]
        image = photo(64 + i % 32, 48, seed=i)
        good[f"{label}/img_{i}.png" if i % 4 == 0 else f"{label}/img_{i}.jpg"] = encode(image, "PNG" if i % 4 == 0 else "JPEG")
    for rel, data in {**good, **bomb_files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root, sorted(good)


def test_a_progressive_time_bomb_is_a_timeout_reject():
    with pytest.raises(images.Rejected) as caught:
        images.canonicalise(bombs.progressive_time_bomb(), timeout_s=1.0)
    assert caught.value.reason == images.TIMEOUT and "over --image_timeout 1 s" in caught.value.message
    # The same construction, small, is a valid image that converts: a bomb by its cost, not by damage.
    small = bombs.progressive_time_bomb(side=256, scans=50)
    assert images.canonicalise(small).height == 256


def _settings(memory):
    return records.Settings(images.Policy(), {"bee": 0}, memory_limit_bytes=memory, reads_in_flight=4)


def test_the_memory_cap_makes_a_memory_bomb_too_large_in_the_pool_and_alone(tmp_path, bomb_files):
    (tmp_path / "bee").mkdir()
    paths = {"bomb": bomb_files["bee/zz_memory_bomb.png"], **{f"good{i}": jpeg(seed=i) for i in range(6)}}
    for name, data in paths.items():
        (tmp_path / "bee" / f"{name}.png").write_bytes(data)
    refs = [ImageRef(f"bee/{name}.png", str(tmp_path / "bee" / f"{name}.png"), "bee", "", len(data)) for name, data in paths.items()]

    pooled = dict(_run_pool(refs, _settings(1 << 30)))
    assert pooled["bee/bomb.png"][1][0] == images.TOO_LARGE
    assert "a limit of 1,024 MB per process" in pooled["bee/bomb.png"][1][1]
    assert all(pooled[f"bee/good{i}.png"][1] is None for i in range(6))

    # Without a pool (a Beam worker), the bomb's size sends it to a process of its own, under the cap.
    alone = {ref.key: records.convert_or_reject(ref, _settings(1 << 30)) for ref in refs}
    assert alone["bee/bomb.png"][1][0] == images.TOO_LARGE
    assert all(alone[f"bee/good{i}.png"][1] is None for i in range(6))
    # With room enough, the same image is a record.
    assert records.convert_or_reject(refs[0], _settings(8 << 30))[1] is None


def _run_pool(refs, settings):
    import functools

    pool = workpool.OrderedMap(2, functools.partial(records.convert_chunk, settings=settings), chunk_size=3, per_chunk=True)
    out = []
    for ref in refs:
        out.extend(pool.put(ref))
    out.extend(pool.drain())
    return [(ref.key, outcome) for ref, outcome in out]


def _env(**extra):
    return dict(os.environ, PYTHONPATH=os.path.join(ROOT, "tests", "crash_plugin") + os.pathsep + ROOT, TF_CPP_MIN_LOG_LEVEL="2",
                BEAM_ETL_TEST_CRASH_PLUGIN="1", **extra)


def _children(pid):
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rpartition(")")[2].split()[1]) == pid:
                        kids.append(int(entry))
            except OSError:
                continue
    return kids


def _pool_processes(launcher):
    """The processes the launcher's forkserver started: the encode pool's."""
    for pid in _children(launcher):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"forkserver" in f.read():
                    return _children(pid)
        except OSError:
            continue
    return []


def _mid_encode(out, launcher):
    """A pool process, once the first chunk of records is staged."""
    chunks = [s / "chunks" for s in out.glob(".staging-*")] if out.exists() else []
    if any(c.exists() and any(c.iterdir()) for c in chunks):
        return _pool_processes(launcher)[:1]
    return []


def _mid_write(out, launcher):
    """The pool process that has a shard open (tests/slow_shards keeps a DEST.writing open for 2 s)."""
    for pid in _pool_processes(launcher):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}").endswith(".writing"):
                    return [pid]
        except OSError:
            continue
    return []


def _convert(folder, out, args, condition=None, env=None, timeout=600):
    """Run convert, SIGKILLing the first process `condition` names; returns (returncode, output, killed pid)."""
    log = open(out.parent / "convert.log", "w+")  # a file: a full pipe would stall the launcher
    proc = subprocess.Popen([sys.executable, "-m", "beam_etl", "convert", "--input", str(folder), "--output", str(out), *args],
                            env=env or _env(), cwd=ROOT, stdout=log, stderr=log, start_new_session=True)
    killed, deadline = None, time.monotonic() + timeout
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            victims = condition(out, proc.pid) if condition and killed is None else []
            if victims:
                killed = victims[0]
                os.kill(killed, signal.SIGKILL)
            time.sleep(0.01)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    log.seek(0)
    return proc.returncode, log.read(), killed


def _check(out, good_keys, bad, text):
    from tests.test_convert_e2e import read_records

    document = json.loads((out / "dataset.json").read_text())
    keys = collections.Counter(r["key"].decode() for split in document["splits"] for r in read_records(out, document, split))
    assert keys == collections.Counter(good_keys), text[-3000:]  # every good image, each once
    rejects = [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]
    assert {r["key"]: r["reason"] for r in rejects} == bad, text[-3000:]
    assert document["inputs"] == len(good_keys) + len(bad)
    assert verify.verify(str(out), decode=False, log=lambda _: None) == []
    return rejects


def test_bombs_and_crashes_cost_one_input_each_in_the_pool(hostile_folder, tmp_path):
    folder, good = hostile_folder
    code, text, _ = _convert(folder, tmp_path / "ds", ["--encode_processes", "2", *LIMITS])
    assert code == 0, text[-3000:]
    rejects = _check(tmp_path / "ds", good, BAD, text)
    messages = {r["key"]: r["message"] for r in rejects}
    assert "over --image_timeout 2 s" in messages["ant/zz_time_bomb.jpg"]
    assert "died with SIGSEGV" in messages["cow/zz_crash_segv.png"] and "died with SIGKILL" in messages["cow/zz_crash_kill.png"]
    assert "encode-pool processes died and were replaced" in text


@pytest.mark.parametrize("when", ["mid_encode", "mid_write"])
def test_a_pool_process_killed_from_outside_costs_no_input(when, hostile_folder, tmp_path):
    folder, good = hostile_folder
    condition, env = (_mid_encode, _env()) if when == "mid_encode" else (_mid_write, _env(BEAM_ETL_TEST_SHARD_PAUSE="2"))
    code, text, killed = _convert(folder, tmp_path / "ds", ["--encode_processes", "2", "--num_shards", "3", *LIMITS], condition, env)
    assert killed, f"no pool process seen {when}"
    assert code == 0, text[-3000:]
    _check(tmp_path / "ds", good, BAD, text)  # no input rejected for the kill, none written twice
    assert not list((tmp_path / "ds").glob(".staging-*"))


def test_bombs_without_a_pool_cost_one_input_each(tmp_path, bomb_files):
    folder = tmp_path / "images"
    files = make_folder(folder, seeds=range(60), extra={k: v for k, v in bomb_files.items() if "crash" not in k})
    bad = {k: v for k, v in BAD.items() if "crash" not in k}
    proc = run_convert("--input", folder, "--output", tmp_path / "ds", "--encode_processes", "0", *LIMITS)
    _check(tmp_path / "ds", sorted(set(files) - set(bad)), bad, proc.stderr)


def test_a_read_asks_for_the_listed_size_and_still_finds_a_file_that_grew(tmp_path):
    from beam_etl import sources

    path = tmp_path / "a.jpg"
    path.write_bytes(b"x" * 1000)
    ref = lambda size: ImageRef("a.jpg", str(path), "a", "", size)  # noqa: E731
    assert sources.read_bytes(ref(1000), 64_000_000) == b"x" * 1000
    assert sources.read_bytes(ref(-1), 64_000_000) == b"x" * 1000  # size unknown
    assert sources.read_bytes(ref(10), 64_000_000) == b"x" * 1000  # grew since it was listed
    with pytest.raises(images.Rejected, match="over --max_file_mb"):
        sources.read_bytes(ref(10), 500)  # grew past the limit


def test_a_death_alone_names_its_cause():
    ref = ImageRef("a/b.jpg", "/x/a/b.jpg", "a", "", 10)
    assert records.crashed(ref, "SIGALRM", 2.0)[1][0] == images.TIMEOUT  # the pool process's own hard limit
    assert "within 14 s" in records.crashed(ref, "SIGALRM", 2.0)[1][1]
    reason, message = records.crashed(ref, "SIGSEGV", 2.0)[1]
    assert reason == images.WORKER_CRASHED and "died with SIGSEGV" in message


def test_a_decode_that_never_returns_is_a_timeout_by_the_pool_process_hard_limit(tmp_path):
    """No clock check can run inside a C call that hangs: the process's own SIGALRM ends it, twice, then alone."""
    folder = tmp_path / "images"
    files = make_folder(folder, seeds=range(20), extra={"ant/zz_hang.png": bombs.crash_file("HANG")})
    code, text, _ = _convert(folder, tmp_path / "ds", ["--encode_processes", "2", "--image_timeout", "0.5"])
    assert code == 0, text[-3000:]
    rejects = _check(tmp_path / "ds", sorted(set(files) - {"ant/zz_hang.png"}), {"ant/zz_hang.png": "timeout"}, text)
    assert "did not end within 11 s" in rejects[0]["message"]


def test_the_cli_default_timeout_is_the_one_images_uses():
    """cli.py spells 30.0 out (it imports no Pillow for --help): pinned to images.DEFAULT_TIMEOUT_S here."""
    from tests.test_templates import convert_actions

    timeout = next(a for a in convert_actions() if a.option_strings == ["--image_timeout"])
    assert timeout.default == images.DEFAULT_TIMEOUT_S
