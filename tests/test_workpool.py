"""The process pool that the encode step uses on the DirectRunner: order, bounds, and a dying worker."""

import os
import signal
import subprocess
import sys
import time

import pytest

from beam_etl import workpool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _square_with_pid(x):
    return x * x, os.getpid()


def _die_on_13(x):
    if x == 13:
        os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's OOM killer would
    return x


def test_results_come_back_in_input_order_from_several_processes():
    pool = workpool.OrderedMap(2, _square_with_pid, chunk_size=3, max_chunks=2)
    out = []
    for i in range(50):
        out.extend(pool.put(i))
        assert len(pool.pending) <= 2  # bounded: the caller is made to wait
    early = len(out)
    out.extend(pool.drain())
    assert [item for item, _ in out] == list(range(50))
    assert [result for _, (result, _) in out] == [i * i for i in range(50)]
    assert early >= 50 - 3 * 3  # most results left through put(), not at the end
    assert len({pid for _, (_, pid) in out} - {os.getpid()}) == 2


def test_a_killed_worker_names_the_items_and_the_next_step():
    pool = workpool.OrderedMap(2, _die_on_13, chunk_size=4, describe=lambda x: f"item-{x}")
    with pytest.raises(workpool.WorkerDied, match=r"died .* starting with item-\d+; rerun with --encode_processes 0"):
        for i in range(40):
            list(pool.put(i))
        list(pool.drain())
    again = workpool.OrderedMap(2, _square_with_pid)  # the broken pool was replaced
    assert [r for _, (r, _) in list(again.put(3)) + list(again.drain())] == [9]


def test_cores_is_positive():
    assert workpool.cores() >= 1


def test_encode_processes_auto_is_every_core_only_on_the_in_memory_direct_runner():
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_etl import cli

    cores = workpool.cores()
    expected = cores if cores > 1 else 0
    assert cli._encode_processes("auto", cli._pipeline_options([])) == expected
    assert cli._encode_processes("auto", cli._pipeline_options(["--direct_running_mode", "multi_threading"])) == 0
    assert cli._encode_processes("auto", PipelineOptions(["--runner", "DataflowRunner"])) == 0
    assert cli._encode_processes("3", PipelineOptions(["--runner", "DataflowRunner"])) == 3  # asked for: honoured
    assert cli._pipeline_options(["--direct_running_mode", "multi_processing"]).get_all_options()["direct_num_workers"] == cores
    for bad in ("many", "-1"):
        with pytest.raises(ValueError, match="--encode_processes"):
            cli._encode_processes(bad, cli._pipeline_options([]))


def test_a_small_job_gets_no_pool_unless_asked_for():
    from beam_etl import cli

    options = cli._pipeline_options([])
    expected = workpool.cores() if workpool.cores() > 1 else 0
    assert cli._encode_processes("auto", options, listed=cli.SMALL_JOB - 1) == 0
    assert cli._encode_processes("auto", options, listed=cli.SMALL_JOB) == expected
    assert cli._encode_processes("2", options, listed=10) == 2  # asked for: honoured


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads process states from /proc")
def test_workers_leave_when_the_launcher_is_killed(tmp_path):
    # A real launcher process: it starts a pool, reports the pids, then SIGKILLs itself.
    script = (
        "import os, signal, sys\n"
        "from beam_etl import workpool\n"
        "pool = workpool.executor(2)\n"
        "pids = {pool.submit(workpool._noop).result() for _ in range(20)}\n"
        "print(' '.join(map(str, sorted(pids | set(p.pid for p in pool._processes.values())))), flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    out = tmp_path / "pids"
    with open(out, "w") as f:  # a file, not a pipe: the workers inherit it, and a pipe would stay open
        launcher = subprocess.Popen([sys.executable, "-c", script], stdout=f, stderr=subprocess.DEVNULL, cwd=ROOT)
        deadline = time.time() + 120
        while time.time() < deadline and not out.read_text().strip():
            time.sleep(0.1)
        # Not reaped yet: a zombie launcher, as under a parent that does not wait, must count as gone.
        while time.time() < deadline and workpool._running(launcher.pid):
            time.sleep(0.1)
        pids = [int(p) for p in out.read_text().split()]
        assert pids, "the launcher printed no worker pids"
        while time.time() < deadline and any(workpool._running(p) for p in pids):
            time.sleep(0.2)
        alive = [p for p in pids if workpool._running(p)]
        launcher.wait(timeout=10)
    assert launcher.returncode == -signal.SIGKILL
    assert not alive, "pool workers outlived their killed launcher"
