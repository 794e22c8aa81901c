"""The Flink topology on one machine: SDK workers in processes of their own, from one worker pool.

Beam's worker pool runs as templates/flink's TaskManager sidecar runs it (tests/worker_pool.py);
`beam-etl convert` submits to the embedded job service with --environment_type=EXTERNAL and two
workers. Inputs and outputs are on the GCS emulator for the equality test, and on local disk
where workers are killed (a larger input, so that a kill lands mid-stage).
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from beam_etl import runners
from tests import objstore_cases as cases
from tests.conftest import ROOT, run_convert
from tests.objstore_cases import FLAGS, INPUTS, last_line, local_summary, records, run
from tests.test_faults import MNIST_FLAGS, records_by_split
from tests.test_objstore_input import _tripwire_env, _tripwire_log
from tests.worker_pool import WorkerPool

LEFTOVERS = ("/.staging-", "/tft_tmp", "/beam-temp-")


@pytest.fixture(scope="module")
def pool(gcs_server, tmp_path_factory):
    """Two or more SDK workers come from this pool; it reaches the GCS emulator as the launcher does.

    No Google credentials anywhere, and the tripwire in each worker process: it logs every
    entry into Beam's credential retry loop (the ~25 s wait) to pool.tripwire.
    """
    folder = tmp_path_factory.mktemp("pool")
    env = dict(cases.env(gcs_server), **_tripwire_env(folder))
    pool = WorkerPool(str(folder), env)
    pool.tripwire = folder
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def gs_photos(gcs_server, objstore_photos):
    root, local = objstore_photos
    cases.upload_photos(gcs_server, root, "gs://bkt/external/photos")
    return "gs://bkt/external/photos/", local_summary(local), json.loads((local / "dataset.json").read_text())


@pytest.mark.parametrize("writer", ["staged", "tfrecordio"])
def test_two_sdk_workers_write_what_the_direct_runner_writes(writer, pool, gcs_server, gs_photos):
    source, expected, direct = gs_photos  # direct: the DirectRunner's dataset.json
    out = f"gs://bkt/external/{writer}"
    proc = run(gcs_server, "beam_etl", "convert", "--input", source, "--output", out, *FLAGS, "--writer", writer,
               *pool.flags(workers=2), timeout=600)
    assert "submitted to PortableRunner" in proc.stderr
    document = json.loads(gcs_server.read(out + "/dataset.json"))
    # Two worker processes ran bundles: each left its name (host-pid) in the staging folder.
    assert document["worker_processes"] == 2, document["worker_processes"]
    assert {"worker_0", "worker_1"} <= set(pool.started_workers())
    # Each worker decided on anonymous access once: none waited in Beam's credential retries.
    tripwire = _tripwire_log(pool.tripwire)
    assert tripwire["armed"] >= 2 and tripwire["entered"] == 0, tripwire
    assert records(gcs_server, out) == expected["records"]
    assert document["label_names"] == expected["label_names"] and document["inputs"] == INPUTS
    assert document["rejected"] == expected["rejected"]
    rejects = sorted((r["key"], r["reason"]) for r in map(json.loads, gcs_server.read(out + "/rejected.jsonl").decode().splitlines()))
    assert rejects == expected["rejects"]
    listed = gcs_server.list(out + "/")
    assert not [u for u in listed if any(mark in u for mark in LEFTOVERS)], listed
    for split, info in direct["splits"].items():
        assert len(document["splits"][split]["shards"]) == len(info["shards"])
        assert document["splits"][split]["label_counts"] == info["label_counts"]


def test_an_update_on_external_workers_equals_a_full_conversion(pool, mnist_folder, tmp_path):
    """convert --update with two SDK workers of the pool: the version it publishes is a full conversion's."""
    from tests.test_update import update_on_another_runner

    proc = update_on_another_runner(mnist_folder, tmp_path, lambda *args: run(None, "beam_etl", *args, timeout=600), pool.flags(workers=2))
    assert "submitted to PortableRunner" in proc.stderr


def test_workers_that_cannot_start_fail_the_launcher_in_one_line(gcs_server, objstore_photos, tmp_path):
    """The pool's python lacks apache_beam: each worker dies at import, and the launcher says so."""
    broken = WorkerPool(str(tmp_path / "pool"), cases.env(gcs_server), broken=True)
    try:
        root, _ = objstore_photos
        out = tmp_path / "ds"
        proc = run(None, "beam_etl", "convert", "--input", root, "--output", out, *FLAGS, *broken.flags(),
                   "--worker_start_timeout", "20", check=False, timeout=300)  # without the watch it waits forever
        assert "ModuleNotFoundError: No module named 'apache_beam'" in broken.text()
    finally:
        broken.close()
    assert proc.returncode == 1, proc.stderr[-3000:]
    line = last_line(proc)
    assert line.startswith("beam-etl: conversion failed: no SDK worker ran a bundle within 20 s"), line
    assert "never connected" in line and f"worker pool at {broken.address}" in line
    assert not (out / "dataset.json").exists()


def _staging(out):
    return [p for p in out.iterdir() if p.name.startswith(".staging-")] if out.exists() else []


def _listing(out):
    """The first worker has checked in: it is listing the input; the other has run nothing yet."""
    for staging in _staging(out):
        names = runners.checked_in(runners.checkin_folder(str(staging)))
        if names:
            return names[:1]
    return []


def _mid_encode(out):
    """Both workers have begun encoding: each checked in (the listing runs on one of them)."""
    for staging in _staging(out):
        names = runners.checked_in(runners.checkin_folder(str(staging)))
        if len(names) >= 2:
            return names
    return []


def _mid_shard_pass(out):
    """Shard bytes are being written: a file under shards/ (WriteToTFRecord's temp shards are in a
    beam-temp-* folder there, which its first step creates empty; our shard pass writes there)."""
    for staging in _staging(out):
        if any(f.is_file() for f in (staging / "shards").rglob("*")):
            return runners.checked_in(runners.checkin_folder(str(staging)))
    return []


def _safely(condition, out):
    try:
        return condition(out)
    except FileNotFoundError:  # a folder went away while it was listed
        return []


POINTS = {
    "listing": ("tfrecordio", _listing),  # killed while the other worker is idle: Beam alone hung here
    "encode": ("tfrecordio", _mid_encode),
    "shards": ("tfrecordio", _mid_shard_pass),
    "staged_shards": ("staged", _mid_shard_pass),
}


@pytest.mark.parametrize("point", sorted(POINTS))
def test_a_killed_worker_fails_the_job_in_one_line_and_a_rerun_completes(point, pool, mnist_folder, mnist_dataset, tmp_path):
    writer, condition = POINTS[point]
    out = tmp_path / "ds"
    args = ["convert", "--input", str(mnist_folder), "--output", str(out), *MNIST_FLAGS, "--writer", writer, *pool.flags()]
    log = open(tmp_path / "convert.log", "w+")  # a file, not a pipe: a full pipe would stall the launcher
    proc = subprocess.Popen([sys.executable, "-m", "beam_etl", *args], env=cases.env(None), cwd=ROOT,
                            stdout=log, stderr=log, start_new_session=True)
    killed = None
    deadline = time.time() + 600
    while proc.poll() is None and time.time() < deadline and killed is None:
        for name in _safely(condition, out):
            pid = int(name.rsplit("-", 1)[1])
            try:
                os.kill(pid, signal.SIGKILL)  # an SDK worker, started by the pool
                killed = pid
                break
            except ProcessLookupError:
                continue
        time.sleep(0.01)
    try:
        proc.wait(timeout=300)  # Beam alone waited forever at "listing"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    log.seek(0)
    stderr = log.read()
    assert killed, f"no worker was seen at {point}: the job ended first ({proc.returncode})\n{stderr[-2000:]}"
    # Beam's FnApiRunner does not retry a bundle whose worker died: the job fails, in one line.
    assert proc.returncode == 1, stderr[-3000:]
    line = stderr.strip().splitlines()[-1]
    assert line.startswith("beam-etl: conversion failed: an SDK worker process died while the job ran"), line
    assert "nothing was published" in line and pool.address in line
    assert not (out / "dataset.json").exists()
    assert not [p for p in out.iterdir() if p.name.endswith(".tfrecord")]
    # The same command again completes, and equals the DirectRunner's conversion.
    rerun = run_convert(*args[1:])
    assert "submitted to PortableRunner" in rerun.stderr
    assert not _staging(out)
    assert records_by_split(out) == records_by_split(mnist_dataset)
