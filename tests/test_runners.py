"""beam_etl.runners: which runner, the start timeout, worker check-ins and the failure lines."""

import os
import threading

import pytest
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions

from beam_etl import runners, workpool

EMBEDDED = ["--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=EXTERNAL", "--environment_config=localhost:50000"]


def options(*flags):
    return PipelineOptions(list(flags))


def test_embedded_external_is_recognised_only_with_all_three_flags():
    assert runners.embedded_external(options(*EMBEDDED))
    assert not runners.embedded_external(options("--runner=PortableRunner", "--job_endpoint=localhost:8099", "--environment_type=EXTERNAL"))
    assert not runners.embedded_external(options("--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=LOOPBACK"))
    assert not runners.embedded_external(options("--runner=FlinkRunner", "--environment_type=EXTERNAL"))
    assert not runners.embedded_external(options())


def test_the_embedded_job_service_gets_the_external_environment_and_the_worker_count():
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.transforms import environments

    opts = options(*EMBEDDED, "--direct_num_workers=3")
    runner = runners.build(opts)
    assert isinstance(runner, fn_runner.FnApiRunner)
    assert isinstance(runner._default_environment, environments.ExternalEnvironment)
    assert runner._default_environment.url == "localhost:50000"
    assert opts.view_as(DirectOptions).direct_num_workers == 3
    every_core = options(*EMBEDDED, "--direct_num_workers=0")
    runners.build(every_core)
    assert every_core.view_as(DirectOptions).direct_num_workers == workpool.cores()
    # Not given: the CLI asks for every core, as for the DirectRunner's multi-process modes.
    from beam_etl import cli

    assert cli._pipeline_options(EMBEDDED).view_as(DirectOptions).direct_num_workers == workpool.cores()
    assert cli._pipeline_options([*EMBEDDED, "--direct_num_workers=2"]).view_as(DirectOptions).direct_num_workers == 2
    assert "2 SDK workers from the pool at localhost:50000" in runners.describe_embedded(options(*EMBEDDED, "--direct_num_workers=2"))


def test_other_runners_are_left_to_beam_and_the_direct_runner_runs_in_process():
    from apache_beam.runners.portability.fn_api_runner import fn_runner

    assert runners.build(options("--runner=FlinkRunner")) is None
    assert runners.build(options("--runner=PortableRunner", "--job_endpoint=localhost:8099")) is None
    direct = runners.build(options())
    assert isinstance(direct, fn_runner.FnApiRunner) and not hasattr(direct._default_environment, "url")


@pytest.mark.parametrize(
    "flags, value, expected",
    [
        ((), "auto", 0.0),  # DirectRunner: its workers are in this process
        (EMBEDDED, "auto", runners.DEFAULT_START_TIMEOUT),
        (("--runner=FlinkRunner", "--environment_type=EXTERNAL"), "auto", runners.DEFAULT_START_TIMEOUT),
        (("--runner=PortableRunner", "--environment_type=PROCESS"), "auto", runners.DEFAULT_START_TIMEOUT),
        (("--runner=DataflowRunner",), "auto", 0.0),  # boots VMs for minutes; fails such jobs itself
        (EMBEDDED, "30", 30.0),
        (EMBEDDED, "0", 0.0),
        ((), "45.5", 45.5),
    ],
)
def test_start_timeout(flags, value, expected):
    assert runners.start_timeout(options(*flags), value) == expected


@pytest.mark.parametrize("value", ["-1", "soon", ""])
def test_a_bad_start_timeout_is_a_usage_error(value):
    with pytest.raises(ValueError, match="--worker_start_timeout"):
        runners.start_timeout(options(*EMBEDDED), value)


def test_each_process_checks_in_once(tmp_path):
    folder = str(tmp_path / "staging" / "workers")
    assert runners.checked_in(folder) == []
    runners.check_in(folder)
    runners.check_in(folder)
    runners.check_in(None)  # no folder: nothing to do
    (name,) = runners.checked_in(folder)
    assert name.endswith(f"-{os.getpid()}")


def test_a_dead_worker_is_explained_and_other_failures_are_not():
    opts = options(*EMBEDDED)
    line = runners.explain("RuntimeError: Channel closed prematurely.", opts)
    assert "SDK worker process died" in line and "localhost:50000" in line and "nothing was published" in line
    assert runners.explain("ValueError: bad shard", opts) == ""
    text = runners.never_connected(opts, 20)
    assert "within 20 s" in text and "never connected" in text and "localhost:50000" in text


def test_a_worker_whose_control_stream_breaks_aborts_its_instructions():
    """Beam's own ControlConnection, fed a stream that breaks as a dead worker's does.

    Without runners._abort_when_a_worker_dies the futures below are never set (the launcher
    hung). It relies on private names of Beam 2.77; an upgrade that drops them fails here.
    """
    import grpc
    from apache_beam.portability.api import beam_fn_api_pb2
    from apache_beam.runners.portability.fn_api_runner import worker_handlers

    runners._abort_when_a_worker_dies()
    connection = worker_handlers.ControlConnection()
    pending = connection.push(beam_fn_api_pb2.InstructionRequest())
    gate = threading.Event()

    def stream():  # what grpc hands the runner: the worker's responses, until its process dies
        gate.wait(10)
        raise grpc.RpcError()
        yield  # a generator

    connection.set_input(stream())
    gate.set()
    with pytest.raises(runners.WorkerDied, match=runners.DIED):
        pending.get(timeout=10)
    later = connection.push(beam_fn_api_pb2.InstructionRequest())
    with pytest.raises(runners.WorkerDied, match="control stream broke"):
        later.get(timeout=10)
    assert runners.explain(str(runners.WorkerDied(f"{runners.DIED}: x")), options(*EMBEDDED))
