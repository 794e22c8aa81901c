"""Beam's SDK worker pool, with one change: a worker killed before it connects is started again.

A Flink TaskManager asks the pool for a worker and then waits for that worker's control
connection with no time limit (Beam's ExternalEnvironmentFactory retries its 2-minute wait
forever). A worker that is killed before it connects (by the OOM killer, an operator, a node
drain) therefore holds its tasks, and the job, for good: measured, nothing ran for 600 s and
Flink never restarted anything, since no task had failed. Here each worker process is
watched, and one that dies by a signal before the runner asked to stop it is started again
under the same worker id, which is what the TaskManager waits for. A worker that dies after it
connected fails its tasks as before, and Flink restarts the job; its stand-in idles until the
TaskManager stops that worker id. Everything else is Beam's worker_pool_main.

    python -m beam_etl.sdk_pool --service_port=50000   (templates/flink's sidecar)
"""

import logging
import subprocess
import threading

from apache_beam.runners.worker import worker_pool_main

MAX_RESTARTS = 3  # per worker id: a worker that keeps dying is a broken image, not a stray kill
_LOGGER = logging.getLogger(__name__)


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
        code = process.wait()
        with self._lock:
            request = self._requests.get(worker_id)
            current = self._worker_processes.get(worker_id) is process
        if request is None or not current or code >= 0:
            return  # stopped by the runner, replaced already, or exited by itself (its log says why)
        if restarts >= MAX_RESTARTS:
            _LOGGER.error("SDK worker %s died by signal %d again; not starting it a %dth time", worker_id, -code,
                          restarts + 2)
            return
        _LOGGER.warning("SDK worker %s died by signal %d; starting it again under the same id", worker_id, -code)
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
