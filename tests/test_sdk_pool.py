"""beam_etl.sdk_pool: Beam's worker pool, which starts again a worker killed before the runner stopped it."""

import os
import signal
import socket
import subprocess
import sys
import time

import grpc
from apache_beam.portability.api import beam_fn_api_pb2, beam_fn_api_pb2_grpc, endpoints_pb2

from beam_etl import sdk_pool
from tests.conftest import ROOT
from tests.objstore_servers import _wait_for_port, free_port
from tests.worker_pool import children


def _wait_for(condition, what, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _start_pool(tmp_path):
    port = free_port()
    log = open(tmp_path / "pool.log", "wb")
    pool = subprocess.Popen([sys.executable, "-m", "beam_etl.sdk_pool", f"--service_port={port}"], cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=ROOT), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    log.close()
    _wait_for_port(port, pool, "the SDK worker pool")
    return pool, beam_fn_api_pb2_grpc.BeamFnExternalWorkerPoolStub(grpc.insecure_channel(f"localhost:{port}"))


def _start_worker(stub, worker_id, control):
    """Ask the pool for a worker, as a TaskManager does, with its control endpoint at localhost:control."""
    request = beam_fn_api_pb2.StartWorkerRequest(
        worker_id=worker_id, control_endpoint=endpoints_pb2.ApiServiceDescriptor(url=f"localhost:{control}"))
    assert not stub.StartWorker(request).error


def test_a_worker_killed_before_it_connects_is_started_again_until_the_runner_stops_it(tmp_path):
    control = free_port()  # nothing listens: the worker waits there to connect, as before a TaskManager answers
    pool, stub = _start_pool(tmp_path)
    try:
        _start_worker(stub, "w-1", control)
        (first,) = _wait_for(lambda: children(pool.pid), "the worker")
        os.kill(first, signal.SIGKILL)
        (second,) = _wait_for(lambda: [p for p in children(pool.pid) if p != first], "a second worker")
        assert "SDK worker w-1 died by signal 9 before it connected; starting it again under the same id" in (tmp_path / "pool.log").read_text()
        with open(f"/proc/{second}/cmdline", "rb") as f:
            assert b'worker_id="w-1"' in f.read()  # the id the TaskManager waits for
        # Once the runner stops the worker, its end is expected: nothing starts again.
        assert not stub.StopWorker(beam_fn_api_pb2.StopWorkerRequest(worker_id="w-1")).error
        _wait_for(lambda: not children(pool.pid), "the stopped worker to exit")
        time.sleep(1.0)
        assert children(pool.pid) == []
        assert (tmp_path / "pool.log").read_text().count("starting it again") == 1
    finally:
        os.killpg(pool.pid, signal.SIGKILL)
        pool.wait()


def test_a_worker_killed_after_it_connected_is_left_dead(tmp_path):
    """A stand-in would connect to the old environment, which the TaskManager then fails on restart."""
    listener = socket.create_server(("localhost", 0))  # the kernel completes the connection: "connected"
    control = listener.getsockname()[1]
    pool, stub = _start_pool(tmp_path)
    try:
        _start_worker(stub, "w-2", control)
        (worker,) = _wait_for(lambda: children(pool.pid), "the worker")
        _wait_for(lambda: sdk_pool.has_connected(worker, control), "the worker's control connection")
        time.sleep(0.5)  # the pool's watcher polls every 20 ms
        os.kill(worker, signal.SIGKILL)
        _wait_for(lambda: "died by signal 9 after it connected" in (tmp_path / "pool.log").read_text(),
                  "the pool to see the death")
        time.sleep(1.0)
        assert children(pool.pid) == []
        assert "starting it again" not in (tmp_path / "pool.log").read_text()
    finally:
        os.killpg(pool.pid, signal.SIGKILL)
        pool.wait()
        listener.close()


def test_has_connected_reads_a_processes_own_sockets():
    listener = socket.create_server(("localhost", 0))
    port = listener.getsockname()[1]
    assert sdk_pool.has_connected(os.getpid(), port) is False
    client = socket.create_connection(("localhost", port))
    try:
        assert sdk_pool.has_connected(os.getpid(), port) is True
        assert sdk_pool.has_connected(os.getpid(), free_port()) is False
    finally:
        client.close()
        listener.close()
    assert sdk_pool.control_port("localhost:43407") == 43407
    assert sdk_pool.control_port("[::1]:5000") == 5000
    assert sdk_pool.control_port("localhost") is None
