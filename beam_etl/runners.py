"""Which Beam runner runs `convert`, and the launcher's watch on SDK workers in their own processes.

Runner specifics live here, not in the CLI or the transforms: the DirectRunner's FnApiRunner
without Prism, the embedded job service with SDK workers from an external pool (the Flink
topology on one machine), the check-in that each worker process leaves, and the one-line
explanations of the ways external workers fail.
"""

import logging
import os
import socket
import threading
import time

from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

# Environments whose SDK workers a pool or a process starts within seconds of the job: when
# none checks in within --worker_start_timeout, something is wrong with how they start.
_QUICK_ENVIRONMENTS = ("EXTERNAL", "PROCESS", "LOOPBACK", "DOCKER")
DEFAULT_START_TIMEOUT = 120.0
# On a job server (Flink), a worker that dies before it connects holds its tasks for Beam's own
# 3 minutes, then Flink restarts the job with new workers (measured: done after 275 s). The
# watch must not fail a job that Flink is about to recover, so it waits longer there.
JOB_SERVER_START_TIMEOUT = 600.0
# The job server translates a job for seconds (tens on a loaded machine) before Flink has it,
# and a cancel through the job service does not stop that: measured, a job cancelled there 1 s
# after its submission reached Flink later, ran to the end and published.
SUBMIT_GRACE = 120.0
_CHECKED_IN = set()
_LOCK = threading.Lock()


class FlinkEnvironmentOptions(PipelineOptions):
    """Java's PortablePipelineOptions.environmentExpirationMillis, which Python's options lack.

    The PortableRunner passes on only the options Python knows; declared here, it reaches the
    job server as environment_expiration_millis.
    """

    @classmethod
    def _add_argparse_args(cls, parser):
        parser.add_argument(
            "--environment_expiration_millis", type=int, default=0,
            help="a TaskManager replaces a cached SDK environment this long after it made it, for tasks that start "
                 "later (0: never). Flink's restart after an SDK worker died can find that worker's environment "
                 "still cached for the job, and fail at once on each attempt; `beam-etl flink up` prints 10000")


class WorkersNeverConnected(RuntimeError):
    """No SDK worker process ran a bundle within the start timeout."""


class WorkerDied(RuntimeError):
    """An SDK worker's control stream ended while the job still needed it."""


DIED = "an SDK worker process died"  # in WorkerDied's text, for explain()


def embedded_external(options) -> bool:
    """--runner=PortableRunner --job_endpoint=embed --environment_type=EXTERNAL."""
    from apache_beam.options.pipeline_options import PortableOptions, StandardOptions

    portable = options.view_as(PortableOptions)
    runner = str(options.view_as(StandardOptions).runner or "").split(".")[-1]
    return runner == "PortableRunner" and portable.job_endpoint == "embed" and (portable.environment_type or "").upper() == "EXTERNAL"


def on_job_server(options) -> bool:
    """--runner=PortableRunner with a --job_endpoint of a job server (Flink's), not the embedded one."""
    from apache_beam.options.pipeline_options import PortableOptions, StandardOptions

    runner = str(options.view_as(StandardOptions).runner or "").split(".")[-1]
    endpoint = options.view_as(PortableOptions).job_endpoint
    return runner == "PortableRunner" and bool(endpoint) and endpoint != "embed"


def check_job_server(options) -> None:
    """Fail within seconds, in one line, when no job server or no Flink answers at the given address."""
    from apache_beam.options.pipeline_options import PortableOptions

    from beam_etl import flinkrest

    if not on_job_server(options):
        return
    endpoint = options.view_as(PortableOptions).job_endpoint
    host, _, port = endpoint.rpartition(":")
    try:
        socket.create_connection((host or "localhost", int(port)), timeout=3.0).close()
    except (OSError, ValueError) as e:
        raise ValueError(f"no job server at --job_endpoint={endpoint} ({getattr(e, 'strerror', None) or e}); "
                         "start a local Flink with `beam-etl flink up` and pass the flags it prints") from None
    base = flinkrest.master(options)
    if base is None:
        return
    try:
        overview = flinkrest.check(base)
    except flinkrest.Unreachable as e:
        raise ValueError(f"no Flink cluster at --flink_master ({e}); start one with `beam-etl flink up`, "
                         "or pass the address of its REST API") from None
    if not overview.get("slots-total"):
        raise ValueError(f"the Flink cluster at {base} has no TaskManager (0 slots); start one, or "
                         "`beam-etl flink down` and `up` again")


def name_job(options) -> str:
    """A name unique to this run, so that the job can be found on the cluster (and cancelled)."""
    from apache_beam.options.pipeline_options import GoogleCloudOptions

    cloud = options.view_as(GoogleCloudOptions)
    if not cloud.job_name:
        cloud.job_name = f"beam-etl-convert-{time.strftime('%Y%m%d-%H%M%S')}-{os.urandom(3).hex()}"
    return cloud.job_name


def stop_on_cluster(result, options) -> str:
    """Cancel the job this launcher submitted, where it still runs; '' when nothing was running."""
    from beam_etl import flinkrest

    if not on_job_server(options):
        return ""
    ended = _failed(result)  # the job server gave up on it: nothing more reaches Flink
    _cancel(result)  # the job service's cancel: it stops the job server's wait, not the Flink job
    base, name = flinkrest.master(options), name_job(options)
    if base is None:
        return "" if result is None else "cancelled through the job server (pass --flink_master to cancel it on the cluster too)"
    # A job the job server is still translating reaches Flink seconds later: wait for it a while.
    deadline = time.monotonic() + (0.0 if result is None or ended else SUBMIT_GRACE)
    while True:
        try:
            cancelled, on_cluster = flinkrest.cancel_named(base, name)
        except flinkrest.Unreachable as e:
            return f"could not cancel job {name} on the cluster ({e}): cancel it in Flink's web UI"
        if cancelled or on_cluster or time.monotonic() > deadline:  # on the cluster and ended: nothing to cancel
            break
        time.sleep(0.5)
    if not cancelled:
        return ""
    return f"cancelled Flink job {', '.join(jid for jid, _ in cancelled)} ({name}) on the cluster at {base}"


def _failed(result) -> bool:
    """The job service says the job failed or finished (a CANCELLED there may still reach Flink)."""
    from apache_beam.runners.runner import PipelineState

    try:
        return result is not None and result.state in (PipelineState.DONE, PipelineState.FAILED)
    except Exception:  # noqa: BLE001 - the job service is gone: then nothing more reaches Flink
        return True


def external_workers(options) -> int:
    """How many SDK workers the embedded job service asks the pool for (cli sets every core by default)."""
    from apache_beam.options.pipeline_options import DirectOptions

    from beam_etl import workpool

    wanted = options.view_as(DirectOptions).direct_num_workers
    return wanted if wanted else workpool.cores()  # 0: every core, as Beam reads it


def build(options):
    """The runner object for beam.Pipeline, or None to let Beam build the one --runner names."""
    from beam_etl import progress

    if not (progress.is_direct(options) or embedded_external(options)):
        return None
    from apache_beam.options.pipeline_options import DirectOptions, PortableOptions
    from apache_beam.portability.api import beam_provision_api_pb2
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.runners.portability.portable_runner import JobServiceHandle
    from apache_beam.transforms import environments

    # As SwitchingDirectRunner.run_pipeline does, so that workers see the pipeline options.
    encoded = JobServiceHandle.encode_pipeline_options(options.get_all_options())
    provision = fn_runner.ExtendedProvisionInfo(beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded))
    if progress.is_direct(options):  # the DirectRunner's own choice, without its attempt to start Prism
        return fn_runner.FnApiRunner(provision_info=provision)
    # The embedded job service is this same FnApiRunner, but it always asks the pool for one
    # worker (Beam 2.77 reads --direct_num_workers only in run_pipeline, which it skips).
    # Given the external environment here, the runner asks the pool for N workers.
    _abort_when_a_worker_dies()
    options.view_as(DirectOptions).direct_num_workers = external_workers(options)
    # Its advice to use another running mode does not apply: those replace this environment.
    logging.getLogger(fn_runner.__name__).addFilter(lambda record: "direct_num_workers is not equal" not in record.getMessage())
    environment = environments.ExternalEnvironment.from_options(options.view_as(PortableOptions))
    return fn_runner.FnApiRunner(default_environment=environment, provision_info=provision)


def _abort_when_a_worker_dies() -> None:
    """Fail the job, not hang it, when an SDK worker process dies between two bundles.

    Beam 2.77's FnApiRunner gives up on a bundle whose worker dies mid-bundle (the data
    stream breaks: "Channel closed prematurely"), but an instruction sent to a worker that
    died while idle waits on a future that nothing will ever set (measured: a worker killed
    after the listing hung the launcher). When a worker's control stream ends, its pending
    instructions and every later one are aborted here. These are private names of
    worker_handlers.ControlConnection; tests/test_runners.py fails if an upgrade drops them.
    """
    from apache_beam.runners.portability.fn_api_runner import worker_handlers

    connection = worker_handlers.ControlConnection
    if getattr(connection, "_beam_etl_aborts", False):
        return
    read, push = connection._read, connection.push

    def read_then_abort(self):
        try:
            read(self)
            why = "its control stream ended"
        except Exception as e:  # noqa: BLE001 - grpc.RpcError when the process died; any end is the end
            why = f"its control stream broke ({type(e).__name__})"
        self._beam_etl_dead = WorkerDied(f"{DIED}: {why}")
        for future in list(self._futures_by_id.values()):
            future.abort(self._beam_etl_dead)

    def push_or_abort(self, request):
        future = push(self, request)
        dead = getattr(self, "_beam_etl_dead", None)
        if dead is not None and future is not None:
            future.abort(dead)
        return future

    connection._read, connection.push = read_then_abort, push_or_abort  # before any connection exists
    connection._beam_etl_aborts = True


def describe_embedded(options) -> str:
    return (f"beam-etl: submitted to PortableRunner (the embedded job service): {external_workers(options)} "
            f"SDK workers from the pool at {_pool_address(options)}")


def start_timeout(options, value: str) -> float:
    """--worker_start_timeout in seconds; 0 waits forever. auto: 120 s where workers start in seconds (600 on a job server)."""
    from apache_beam.options.pipeline_options import PortableOptions

    from beam_etl import progress

    if value != "auto":
        try:
            seconds = float(value)
        except ValueError:
            raise ValueError(f"--worker_start_timeout must be auto or seconds, got {value!r}") from None
        if seconds < 0:
            raise ValueError(f"--worker_start_timeout must be 0 (wait forever) or more, got {value}")
        return seconds
    if progress.is_direct(options):
        return 0.0  # its workers are threads or children of this process
    environment = (options.view_as(PortableOptions).environment_type or "").upper()
    if on_job_server(options) and environment in _QUICK_ENVIRONMENTS:
        return JOB_SERVER_START_TIMEOUT
    # Dataflow boots VMs and pulls images for minutes, and fails a job whose workers never start itself.
    return DEFAULT_START_TIMEOUT if environment in _QUICK_ENVIRONMENTS else 0.0


def checkin_folder(staging: str) -> str:
    return FileSystems.join(staging, "workers")


def check_in(folder) -> None:
    """Leave `folder`/HOST-PID once per worker process: the launcher's sign that workers run bundles."""
    if not folder:
        return
    name = f"{socket.gethostname()}-{os.getpid()}"
    with _LOCK:
        if (folder, name) in _CHECKED_IN:
            return
        _CHECKED_IN.add((folder, name))
    if "://" not in folder:
        os.makedirs(folder, exist_ok=True)
    with FileSystems.create(FileSystems.join(folder, name)) as f:
        f.write(name.encode())  # not empty: Beam's S3 writer can't finish an upload of no parts


def checked_in(folder: str) -> list:
    """The worker processes that have checked in, as HOST-PID names ([] before the folder exists)."""
    found = FileSystems.match([FileSystems.join(folder, "*")])[0].metadata_list
    return sorted(m.path.rsplit("/", 1)[-1] for m in found)


def _pool_address(options) -> str:
    from apache_beam.options.pipeline_options import PortableOptions

    return options.view_as(PortableOptions).environment_config or "the worker pool"


def never_connected(options, timeout: float) -> str:
    return (
        f"no SDK worker ran a bundle within {timeout:.0f} s (--worker_start_timeout): the workers never "
        f"connected; look in the log of the worker pool at {_pool_address(options)} (on Flink, the "
        "beam-worker-pool container of each TaskManager) for why each worker exited, such as a python "
        "there without apache_beam or beam-image-etl"
    )


def run(p, options, folder: str, timeout: float, submitted=lambda result: None):
    """p.run() to the end; raise WorkersNeverConnected when no worker checks in within `timeout` s.

    The job runs on a thread: the embedded job service blocks in p.run() until the job ends,
    and a worker that never connects leaves it waiting forever. The clock starts when the job
    is submitted: p.run() of the FlinkRunner may first spend minutes fetching its job server.
    """
    if timeout <= 0:
        result = p.run()  # on the DirectRunner this returns when the job is done
        submitted(result)
        result.wait_until_finish()
        return result
    outcome = {}
    if embedded_external(options):
        outcome["submitted_at"] = time.monotonic()  # p.run() is the whole job

    def job():
        try:
            outcome["result"] = p.run()
            outcome.setdefault("submitted_at", time.monotonic())
            submitted(outcome["result"])
            outcome["result"].wait_until_finish()
        except BaseException as e:  # noqa: BLE001 - handed to the launcher's thread as it is
            outcome["error"] = e

    thread = threading.Thread(target=job, name="beam-etl-job", daemon=True)
    thread.start()
    while thread.is_alive():
        if _seen(folder):
            thread.join()
            break
        since = outcome.get("submitted_at")
        if since is not None and time.monotonic() - since > timeout:
            _cancel(outcome.get("result"))
            raise WorkersNeverConnected(never_connected(options, timeout))
        thread.join(1.0)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def _seen(folder: str) -> bool:
    try:
        return bool(checked_in(folder))
    except OSError:  # Beam's BeamIOError too: a failed listing is asked again a second later
        return False


def _cancel(result) -> None:
    if result is None:  # the embedded job service had not returned: the process exit ends it
        return
    try:
        result.cancel()
    except Exception:  # noqa: BLE001 - best effort: the job service may be gone too
        pass


def explain(text: str, options) -> str:
    """One line for a job failure caused by a worker process, or '' when it is something else."""
    if "Channel closed prematurely" in text or DIED in text:
        return (
            f"an SDK worker process died while the job ran (its connection closed): nothing was published; look "
            f"in the log of the worker pool at {_pool_address(options)} for why (killed, out of memory), "
            "then run the same command again"
        )
    return ""
