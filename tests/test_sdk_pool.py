"""beam_etl.sdk_pool: Beam's worker pool, which starts again a worker killed before the runner stopped it."""

import os
import signal
import subprocess
import sys
import time

import grpc
from apache_beam.portability.api import beam_fn_api_pb2, beam_fn_api_pb2_grpc, endpoints_pb2

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


def test_a_killed_worker_is_started_again_until_the_runner_stops_it(tmp_path):
    port = free_port()
    control = free_port()  # nothing listens: the worker waits there to connect, as before a TaskManager answers
    log = open(tmp_path / "pool.log", "wb")
    pool = subprocess.Popen([sys.executable, "-m", "beam_etl.sdk_pool", f"--service_port={port}"], cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=ROOT), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        _wait_for_port(port, pool, "the SDK worker pool")
        stub = beam_fn_api_pb2_grpc.BeamFnExternalWorkerPoolStub(grpc.insecure_channel(f"localhost:{port}"))
        request = beam_fn_api_pb2.StartWorkerRequest(
            worker_id="w-1", control_endpoint=endpoints_pb2.ApiServiceDescriptor(url=f"localhost:{control}"))
        assert not stub.StartWorker(request).error
        (first,) = _wait_for(lambda: children(pool.pid), "the worker")
        os.kill(first, signal.SIGKILL)
        (second,) = _wait_for(lambda: [p for p in children(pool.pid) if p != first], "a second worker")
        assert "SDK worker w-1 died by signal 9; starting it again under the same id" in (tmp_path / "pool.log").read_text()
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
        log.close()
