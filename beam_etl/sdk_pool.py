"""Beam's SDK worker pool, with one change: a worker killed before it connects is started again.

A Flink TaskManager asks the pool for a worker and then waits for that worker's control
connection with no time limit (Beam's ExternalEnvironmentFactory retries its 2-minute wait
forever). A worker that is killed before it connects (by the OOM killer, an operator, a node
drain) therefore holds its tasks, and the job, for good: measured, nothing ran for 600 s and
Flink never restarted anything, since no task had failed. Here each worker process is
watched, and one that dies by a signal before it ever opened its control connection is started
again under the same worker id, which is what the TaskManager waits for. A worker that dies
after it connected is left dead: its tasks fail and Flink restarts them with new environments.
(A stand-in for a connected worker would connect to the old environment again, and the
TaskManager, which caches that environment for the job, fails every restarted task on its
cancelled control call: measured, 10 restarts in a row, then the job failed.)
Everything else is Beam's worker_pool_main.

    python -m beam_etl.sdk_pool --service_port=50000   (templates/flink's sidecar)
"""

import logging
import os
import subprocess
import threading
import time
from urllib.parse import urlsplit

from apache_beam.runners.worker import worker_pool_main

MAX_RESTARTS = 3  # per worker id: a worker that keeps dying is a broken image, not a stray kill
POLL_S = 0.02  # how often a worker not yet connected is looked at; the window for a wrong restart
_ESTABLISHED = "01"  # the state column of /proc/net/tcp
_LOGGER = logging.getLogger(__name__)


def control_port(url: str):
    """The port of a control endpoint such as 'localhost:43407', or None if it names none."""
    try:
        return urlsplit("//" + url.split("://")[-1]).port
    except ValueError:
        return None


def has_connected(pid: int, port: int):
    """Whether process `pid` has an established TCP connection to `port`; None if /proc can't say."""
    if not os.path.isdir("/proc/self/fd"):
        return None  # not Linux
    try:
        inodes = set()
        for fd in os.listdir(f"/proc/{pid}/fd"):
            target = _readlink(f"/proc/{pid}/fd/{fd}")
            if target and target.startswith("socket:["):
                inodes.add(target[8:-1])
        rows = []
        for table in ("tcp", "tcp6"):
            try:
                with open(f"/proc/{pid}/net/{table}") as f:
                    rows += f.read().splitlines()[1:]
            except FileNotFoundError:
                continue
    except (FileNotFoundError, ProcessLookupError):
        return False  # the process has ended: what it had is gone
    except OSError:
        return None
    for row in rows:
        cols = row.split()
        # sl local rem st tx:rx tr:when retrnsmt uid timeout inode
        if len(cols) > 9 and cols[3] == _ESTABLISHED and cols[9] in inodes:
            if int(cols[2].rsplit(":", 1)[1], 16) == port:
                return True
    return False


def _readlink(path):
    try:
        return os.readlink(path)
    except FileNotFoundError:
        return None  # the descriptor closed while we looked


class RestartingWorkerPool(worker_pool_main.BeamFnExternalWorkerPoolServicer):
    """Beam's servicer, whose StartWorker also watches the process it started."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._requests = {}  # worker id -> its StartWorkerRequest, until StopWorker
        self._lock = threading.Lock()

    def StartWorker(self, start_worker_request, unused_context):
        response = super().StartWorker(start_worker_request, unused_context)
        worker_id = start_worker_request.worker_id
        process = self._worker_processes.get(worker_id)
        if process is not None and not response.error:
            with self._lock:
                self._requests[worker_id] = start_worker_request
            threading.Thread(target=self._watch, args=(worker_id, process, 0), name=f"watch-{worker_id}",
                             daemon=True).start()
        return response

    def StopWorker(self, stop_worker_request, unused_context):
        with self._lock:
            self._requests.pop(stop_worker_request.worker_id, None)  # from now on its exit is expected
        return super().StopWorker(stop_worker_request, unused_context)

    def _watch(self, worker_id: str, process: subprocess.Popen, restarts: int) -> None:
        request = self._requests.get(worker_id)
        port = control_port(request.control_endpoint.url) if request is not None else None
        connected = port is None  # with no port to look for, never start a stand-in
        while not connected and process.poll() is None:
            # None (no /proc to look in) counts as connected: a wrong stand-in breaks the job
            connected = has_connected(process.pid, port) is not False
            if not connected:
                time.sleep(POLL_S)
        code = process.wait()
        with self._lock:
            request = self._requests.get(worker_id)
            current = self._worker_processes.get(worker_id) is process
        if request is None or not current or code >= 0:
            return  # stopped by the runner, replaced already, or exited by itself (its log says why)
        if connected:
            _LOGGER.warning("SDK worker %s died by signal %d after it connected; its tasks fail and Flink "
                            "restarts them with new workers", worker_id, -code)
            return
        if restarts >= MAX_RESTARTS:
            _LOGGER.error("SDK worker %s died by signal %d again; not starting it a %dth time", worker_id, -code,
                          restarts + 2)
            return
        _LOGGER.warning("SDK worker %s died by signal %d before it connected; starting it again under the "
                        "same id", worker_id, -code)
        response = super().StartWorker(request, None)
        replacement = self._worker_processes.get(worker_id)
        if response.error or replacement is None or replacement is process:
            _LOGGER.error("could not start SDK worker %s again: %s", worker_id, response.error)
            return
        self._watch(worker_id, replacement, restarts + 1)


def main(argv=None) -> None:
    # Beam's main builds its servicer by this name; it is the one thing changed.
    worker_pool_main.BeamFnExternalWorkerPoolServicer = RestartingWorkerPool
    worker_pool_main.main(argv)


if __name__ == "__main__":
    main()
