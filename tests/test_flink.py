"""`beam-etl convert` on a real Flink 1.19 cluster, started by `beam-etl flink up` (beam_etl/flink.py).

One cluster for the module: JobManager, TaskManager with 2 slots, Beam's Flink job server and
the SDK worker pool, all on 127.0.0.1. Conversions run at parallelism 2 and are compared with
the DirectRunner's conversion of the same inputs; faults are real kills of real processes.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from beam_etl import flink, flinkrest, runners
from tests.conftest import ROOT, run_convert
from tests.test_faults import records_by_split
from tests.worker_pool import children

FLAGS = ["--channels", "1", "--image_format", "png", "--validation_fraction", "0.1", "--dedup",
         "--num_shards", "train=3,validation=2", "--max_reject_fraction", "0.2"]


def _env():
    return dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")


def _beam_etl(*args, check=True, timeout=900, env=None):
    proc = subprocess.run([sys.executable, "-m", "beam_etl", *map(str, args)], capture_output=True, text=True,
                          env=env or _env(), cwd=ROOT, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"beam-etl {args[:2]} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return proc


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """`beam-etl flink up` as a user runs it; `down` at the end must leave nothing running."""
    folder = tmp_path_factory.mktemp("flink")
    # The SDK workers keep each shard open 2 s longer (tests/slow_shards), so a kill lands mid-write,
    # and decode tests/bombs.crash_file by crashing (tests/crash_plugin, which also runs slow_shards).
    env = dict(_env(), PYTHONPATH=os.path.join(ROOT, "tests", "crash_plugin") + os.pathsep + ROOT,
               BEAM_ETL_TEST_SHARD_PAUSE="2", BEAM_ETL_TEST_CRASH_PLUGIN="1")
    up = _beam_etl("flink", "up", "--dir", folder, "--any_ports", timeout=600, env=env)
    started = flink.load(str(folder))
    started.flags_printed = up.stdout.split()
    try:
        yield started
    finally:
        down = _beam_etl("flink", "down", "--dir", folder, check=False)
        after = flink.load(str(folder))
        assert down.returncode == 0, down.stderr
        assert after.running() == [], after.running()
        assert not _pool_children(after), "SDK workers outlived `flink down`"


def _pool_children(cluster) -> list:
    """The SDK workers that the cluster's pool started and that still run."""
    return children(cluster.pid("workerpool"))


@pytest.fixture(scope="module")
def digits(mnist_folder, tmp_path_factory):
    """600 real digits (60 a class), 3 exact copies, 2 broken files; and the DirectRunner's conversion."""
    root = tmp_path_factory.mktemp("flink_src") / "digits"
    for label in sorted(os.listdir(mnist_folder)):
        os.makedirs(root / label)
        for name in sorted(os.listdir(mnist_folder / label))[:60]:
            shutil.copy(mnist_folder / label / name, root / label / name)
    for label in ("3", "5", "7"):
        first = sorted(os.listdir(root / label))[0]
        shutil.copy(root / label / first, root / label / f"copy-{first}")
    (root / "4" / "truncated.png").write_bytes((root / "4" / sorted(os.listdir(root / "4"))[0]).read_bytes()[:60])
    (root / "8" / "notes.png").write_bytes(b"not an image at all")
    direct = tmp_path_factory.mktemp("flink_direct") / "ds"
    run_convert("--input", root, "--output", direct, *FLAGS)
    return root, direct


def _rejects(out):
    return sorted((r["key"], r["reason"]) for r in map(json.loads, (out / "rejected.jsonl").read_text().splitlines()))


def _assert_same_dataset(out, direct):
    mine, theirs = (json.loads((d / "dataset.json").read_text()) for d in (out, direct))
    assert records_by_split(out) == records_by_split(direct)
    assert _rejects(out) == _rejects(direct) and mine["rejected"] == theirs["rejected"]
    assert mine["duplicates"] == theirs["duplicates"] and mine["inputs"] == theirs["inputs"]
    for split, info in theirs["splits"].items():
        assert mine["splits"][split]["label_counts"] == info["label_counts"]
        assert len(mine["splits"][split]["shards"]) == len(info["shards"])
    assert mine["statistics"]["label_vocabulary"] == theirs["statistics"]["label_vocabulary"]
    assert (out / "transform_fn" / "saved_model.pb").exists()
    assert not [p.name for p in out.iterdir() if p.name.startswith((".staging-", "beam-temp-", "tft_tmp"))]
    return mine


def test_up_prints_the_flags_that_convert_needs(cluster):
    flags = cluster.flags_printed
    assert flags == cluster.flags()
    assert "--runner=PortableRunner" in flags and "--environment_type=EXTERNAL" in flags and "--parallelism=2" in flags
    overview = flinkrest.check(cluster.rest)
    assert overview["taskmanagers"] == 1 and overview["slots-total"] == 2, overview
    assert overview["flink-version"] == flink.FLINK_VERSION
    # The pool runs templates/flink's sidecar command, and its workers get this interpreter.
    from tests.worker_pool import sidecar_command

    assert sidecar_command()[1:3] == flink.WORKER_POOL
    status = _beam_etl("flink", "status", "--dir", cluster.folder)
    assert status.stdout.split() == flags and "workerpool: running" in status.stderr


def test_jars_are_pinned_and_checked(cluster):
    lock = flink._lock()
    assert len(lock) > 100 and f"{flink.BEAM_RUNNER[1]}-{flink.BEAM_RUNNER[2]}.jar" in lock
    home = flink.job_server_home()
    for name, digest in lock.items():  # what the cluster runs is what the lock names
        assert flink._sha256(os.path.join(home, name)) == digest, name


@pytest.mark.parametrize("writer", ["tfrecordio", "staged"])
def test_flink_writes_what_the_direct_runner_writes(writer, cluster, digits, tmp_path):
    root, direct = digits
    out = tmp_path / "ds"
    proc = _beam_etl("convert", "--input", root, "--output", out, *FLAGS, "--writer", writer, *cluster.flags())
    assert "submitted to PortableRunner" in proc.stderr
    document = _assert_same_dataset(out, direct)
    assert document["rejected"]["by_reason"] == {"duplicate": 3, "not_an_image": 1, "truncated": 1}
    assert document["duplicates"]["removed"] == 3 and document["inputs"] == 605
    assert document["worker_processes"] >= 2, document["worker_processes"]  # two SDK workers took part
    jobs = [j for j in flinkrest._call(cluster.rest + "/jobs/overview")["jobs"] if j["state"] == "FINISHED"]
    assert jobs, "no finished job on the cluster"


def test_a_manifest_converts_on_flink(cluster, digits, tmp_path):
    root, _ = digits
    manifest = tmp_path / "manifest.csv"
    lines = ["path,label,split"]
    for i, label in enumerate(sorted(os.listdir(root))):
        for j, name in enumerate(sorted(os.listdir(root / label))[:20]):
            lines.append(f"{root / label / name},{label},{'validation' if j % 5 == 0 else 'train'}")
    manifest.write_text("\n".join(lines) + "\n")
    direct, out = tmp_path / "direct", tmp_path / "flink"
    args = ["--input", manifest, "--channels", "1", "--num_shards", "2", "--max_reject_fraction", "0.2"]
    run_convert(*args, "--output", direct)
    _beam_etl("convert", *args, "--output", out, *cluster.flags())
    _assert_same_dataset(out, direct)


def test_an_update_on_flink_equals_a_full_conversion(cluster, digits, tmp_path):
    """convert --update submitted to the cluster: the version it publishes is a full conversion's of the new source."""
    from tests.test_update import update_on_another_runner

    proc = update_on_another_runner(digits[0], tmp_path, _beam_etl, cluster.flags())
    assert "submitted to PortableRunner" in proc.stderr


@pytest.mark.parametrize("processes", ["0", "2"])
def test_bombs_and_crashes_cost_one_input_each_on_flink(processes, cluster, digits, tmp_path):
    """In the SDK workers (0): the time limit and the memory rule for large images, and no worker dies.
    With a pool beside each SDK worker (2): the same, and a decoder's crash is one worker_crashed reject."""
    from tests import bombs

    root, _ = digits
    folder = tmp_path / "digits"
    for label in sorted(os.listdir(root)):
        os.makedirs(folder / label)
        for name in sorted(n for n in os.listdir(root / label) if n[0].isdigit())[:10]:  # no copies, no broken files
            shutil.copy(root / label / name, folder / label / name)
    bad = {"1/zz_time_bomb.jpg": ("timeout", bombs.progressive_time_bomb()), "2/zz_memory_bomb.png": ("too_large", bombs.memory_bomb())}
    if processes != "0":  # tests/crash_plugin is on the cluster's PYTHONPATH (the fixture)
        bad["3/zz_crash.png"] = ("worker_crashed", bombs.crash_file("SIGSEGV"))
    for rel, (_, data) in bad.items():
        (folder / rel).write_bytes(data)
    good = sum(len(os.listdir(folder / label)) for label in os.listdir(folder)) - len(bad)
    out = tmp_path / "ds"
    _beam_etl("convert", "--input", folder, "--output", out, "--channels", "1", "--num_shards", "2", "--max_reject_fraction", "0.5",
              "--image_timeout", "2", "--image_memory_mb", "1024", "--encode_processes", processes, *cluster.flags())
    document = json.loads((out / "dataset.json").read_text())
    assert _rejects(out) == sorted((rel, reason) for rel, (reason, _) in bad.items())
    assert sum(split["examples"] for split in document["splits"].values()) == good


def test_no_job_server_or_no_cluster_fails_in_one_line_within_seconds(cluster, digits, tmp_path):
    root, _ = digits
    dead = str(flink.free_port())
    cases = {
        "no job server": [f"--job_endpoint=127.0.0.1:{dead}"],
        "no cluster": [f"--job_endpoint=127.0.0.1:{cluster.ports['job']}", f"--flink_master=127.0.0.1:{dead}"],
    }
    for case, endpoint in cases.items():
        flags = [f for f in cluster.flags() if not f.startswith(("--job_endpoint", "--flink_master"))] + endpoint
        # Beam alone retries for minutes; the subprocess timeout is the guard against that.
        proc = _beam_etl("convert", "--input", root, "--output", tmp_path / "ds", *FLAGS, *flags, check=False, timeout=120)
        assert proc.returncode == 2, (case, proc.stderr[-2000:])
        lines = proc.stderr.strip().splitlines()
        assert lines[-1].startswith("beam-etl: error: no ") and dead in lines[-1], (case, lines[-1])
        assert "Traceback" not in proc.stderr


def _running_job(cluster, timeout=300):
    """The first job that runs on the cluster now, once it runs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        running = [j for j in flinkrest._call(cluster.rest + "/jobs/overview")["jobs"] if j["state"] == "RUNNING"]
        if running:
            return running[0]
        time.sleep(0.2)
    raise AssertionError(f"no job ran on the cluster within {timeout} s")


def _wait_ended(cluster, jid, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = flinkrest.job(cluster.rest, jid)["state"]
        if state in ("CANCELED", "FAILED", "FINISHED"):
            return state
        time.sleep(0.2)
    return state


def test_ctrl_c_and_the_start_watch_cancel_the_job_on_the_cluster(cluster, digits, mnist_folder, tmp_path):
    root, _ = digits
    # Ctrl-C while the job runs: the launcher cancels it on the cluster, in one line. All 5,000
    # digits, so that the job still runs when the signal lands (600 once finished first, in CI).
    out = tmp_path / "ds"
    args = ["convert", "--input", mnist_folder, "--output", out, *FLAGS, *cluster.flags()]
    proc = subprocess.Popen([sys.executable, "-m", "beam_etl", *map(str, args)], env=_env(), cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        job = _running_job(cluster)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr[-3000:]
    line = stderr.strip().splitlines()[-1]
    assert line == f"beam-etl: interrupted; cancelled Flink job {job['jid']} ({job['name']}) on the cluster at {cluster.rest}", line
    assert _wait_ended(cluster, job["jid"]) == "CANCELED"
    assert not (out / "dataset.json").exists()
    # The start watch fires (no worker can check in within 1 s): the command fails, and so does the job.
    proc = _beam_etl("convert", "--input", root, "--output", out, *FLAGS, *cluster.flags(), "--worker_start_timeout", "1", check=False)
    assert proc.returncode == 1, proc.stderr[-3000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("beam-etl: conversion failed: no SDK worker ran a bundle within 1 s"), line
    assert "; cancelled Flink job " in line, line
    jid = line.split("; cancelled Flink job ")[1].split()[0]
    assert _wait_ended(cluster, jid) == "CANCELED"
    assert not (out / "dataset.json").exists()


def _staging_dirs(out):
    return [p for p in out.iterdir() if p.name.startswith(".staging-")] if out.exists() else []


def _checked_in(out) -> list:
    """The SDK worker processes (host-pid) that have run a bundle of this job."""
    names = []
    for staging in _staging_dirs(out):
        try:
            names += runners.checked_in(runners.checkin_folder(str(staging)))
        except OSError:
            continue
    return names


def _sdk_worker_pids(cluster, out, seen):
    """Kill an SDK worker early: one the pool started just now, before it can have connected."""
    return [pid for pid in _pool_children(cluster) if pid not in seen]


def _mid_encode(cluster, out, seen):
    """A worker that has run bundles (its data connection open), while both encode."""
    names = _checked_in(out)
    return [int(n.rsplit("-", 1)[1]) for n in names[-1:]] if len(names) >= 2 else []


def _mid_shard_pass(cluster, out, seen):
    """The worker that has a shard open: ours (a .writing file beside it) or WriteToTFRecord's
    (its temp file in a beam-temp-* folder under shards/); tests/slow_shards keeps them open."""
    holders = []
    for pid in _pool_children(cluster):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                path = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if path.startswith(str(out)) and "/shards/" in path and (path.endswith(".writing") or "/beam-temp-" in path):
                holders.append(pid)
                break
    return holders


def _kill_while_converting(cluster, args, out, condition, log_path, kill=None, timeout=900):
    """Run convert; SIGKILL the first process `condition` names; return (proc, pid killed, seconds)."""
    seen = set(_pool_children(cluster))
    log = open(log_path, "w+")  # a file, not a pipe: a full pipe would stall the launcher
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "beam_etl", *map(str, args)], env=_env(), cwd=ROOT,
                            stdout=log, stderr=log, start_new_session=True)
    killed = None
    try:
        while proc.poll() is None and killed is None and time.monotonic() - started < timeout:
            for pid in condition(cluster, out, seen):
                try:
                    (kill or (lambda p: os.kill(p, signal.SIGKILL)))(pid)
                    killed = pid
                    break
                except ProcessLookupError:
                    continue
            time.sleep(0.01)
        proc.wait(timeout=max(1, timeout - (time.monotonic() - started)))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    log.seek(0)
    proc.output = log.read()
    return proc, killed, time.monotonic() - started


KILLS = {
    # point: (writer, condition)
    "sdk_worker_before_it_connected": ("tfrecordio", _sdk_worker_pids),
    "sdk_worker_mid_encode": ("tfrecordio", _mid_encode),
    "sdk_worker_in_the_shard_pass": ("staged", _mid_shard_pass),
    "sdk_worker_in_writetotfrecord": ("tfrecordio", _mid_shard_pass),
}


@pytest.mark.parametrize("point", sorted(KILLS))
def test_a_killed_sdk_worker_is_recovered_by_flink(point, cluster, digits, tmp_path):
    """Flink restarts the job with new SDK workers; every image is written exactly once."""
    root, direct = digits
    writer, condition = KILLS[point]
    out = tmp_path / "ds"
    args = ["convert", "--input", root, "--output", out, *FLAGS, "--writer", writer, *cluster.flags()]
    proc, killed, seconds = _kill_while_converting(cluster, args, out, condition, tmp_path / "convert.log")
    assert killed, f"no SDK worker was seen at {point}: the job ended first ({proc.returncode})\n{proc.output[-2000:]}"
    assert proc.returncode == 0, proc.output[-3000:]
    print(f"{point}: killed pid {killed}, the job finished after {seconds:.0f} s")
    _assert_same_dataset(out, direct)
    restarts = flinkrest.job(cluster.rest, _last_job(cluster)["jid"]).get("status-counts", {})
    assert _last_job(cluster)["state"] == "FINISHED", restarts


def _last_job(cluster):
    jobs = flinkrest._call(cluster.rest + "/jobs/overview")["jobs"]
    return max(jobs, key=lambda j: j["start-time"])


def test_a_killed_taskmanager_is_replaced_and_the_job_completes(cluster, digits, tmp_path):
    """The TaskManager dies mid-encode; a new one starts; the job restarts on it, or fails in one line
    with nothing published, and the same command then completes."""
    root, direct = digits
    out = tmp_path / "ds"
    args = ["convert", "--input", root, "--output", out, *FLAGS, *cluster.flags()]

    def kill_taskmanager(_worker):
        os.killpg(cluster.pid("taskmanager"), signal.SIGKILL)  # the JVM and what it forked
        cluster.start_taskmanager()

    proc, killed, seconds = _kill_while_converting(cluster, args, out, _mid_encode, tmp_path / "convert.log",
                                                    kill=kill_taskmanager)
    assert killed, f"the job ended before the kill ({proc.returncode})\n{proc.output[-2000:]}"
    print(f"taskmanager killed: convert exited {proc.returncode} after {seconds:.0f} s")
    if proc.returncode != 0:
        line = proc.output.strip().splitlines()[-1]
        assert line.startswith("beam-etl: conversion failed: "), line
        assert not (out / "dataset.json").exists()
        _beam_etl(*args)
    _assert_same_dataset(out, direct)
