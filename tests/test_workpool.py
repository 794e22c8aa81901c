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


def _run_all(pool, items):
    out = []
    for i in items:
        out.extend(pool.put(i))
    out.extend(pool.drain())
    return out


def test_an_item_that_kills_its_process_costs_that_item_only():
    pool = workpool.OrderedMap(2, _die_on_13, chunk_size=4, on_crash=lambda item, death: ("crashed", item, death))
    out = _run_all(pool, range(40))
    assert [item for item, _ in out] == list(range(40))  # every item once, in order
    assert [r for _, r in out] == [("crashed", 13, "SIGKILL") if i == 13 else i for i in range(40)]
    assert pool.lost == 3  # in the pool, then with its chunk alone, then alone
    again = workpool.OrderedMap(2, _square_with_pid)  # the broken pool was replaced
    assert [r for _, (r, _) in _run_all(again, [3])] == [9]


def test_without_on_crash_a_killing_item_is_named():
    pool = workpool.OrderedMap(2, _die_on_13, chunk_size=4, describe=lambda x: f"item-{x}")
    with pytest.raises(workpool.WorkerDied, match=r"died with SIGKILL while working on item-13, twice"):
        _run_all(pool, range(40))


def _slow_square_with_pid(x):
    time.sleep(0.01)
    return x * x, os.getpid()


def test_a_pool_process_killed_from_outside_costs_no_item():
    pool = workpool.OrderedMap(2, _slow_square_with_pid, chunk_size=5, on_crash=lambda item, death: pytest.fail(f"{item} blamed for {death}"))
    out = []
    for i in range(400):
        out.extend(pool.put(i))
        if i == 100:
            victim = next(pid for _, (_, pid) in out)
            os.kill(victim, signal.SIGKILL)
    out.extend(pool.drain())
    assert [item for item, _ in out] == list(range(400))
    assert [r for _, (r, _) in out] == [i * i for i in range(400)]
    assert pool.lost == 1


def _limited(x):
    with workpool.limits(hard_timeout_s=1.0, memory_bytes=1 << 30):
        if x == "allocate":
            try:
                bytearray(2 << 30)
            except MemoryError:
                return "MemoryError"
            return "allocated"
        if x == "hang":
            time.sleep(30)
        return x


def test_limits_cap_memory_and_end_a_hung_process_in_the_pool_only():
    pool = workpool.OrderedMap(2, _limited, chunk_size=1, on_crash=lambda item, death: death)
    assert [r for _, r in _run_all(pool, ["allocate", "hang", "fine"])] == ["MemoryError", "SIGALRM", "fine"]
    assert _limited("fine") == "fine"  # here, outside a pool process, nothing is set
    import resource

    assert resource.getrlimit(resource.RLIMIT_DATA)[0] == resource.RLIM_INFINITY


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


def _rss_kept_after_freeing(mb):
    """In a pool process: how much of a freed `mb` MB block the process still holds (MB)."""
    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    before = rss()
    block = bytearray(mb << 20)
    block[::4096] = b"x" * len(block[::4096])  # touch every page
    del block
    return rss() - before


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_pool_processes_keep_freed_memory_for_the_next_image():
    """tune_malloc in every pool process: a freed 40 MB block stays for reuse instead of going back to the kernel."""
    pool = workpool.OrderedMap(1, _rss_kept_after_freeing)
    (kept,) = [kept for _, kept in [*pool.put(40), *pool.drain()]]
    assert kept > 30, kept
    untuned = subprocess.run([sys.executable, "-c", "from tests.test_workpool import _rss_kept_after_freeing as f; print(f(40))"],
                             cwd=ROOT, capture_output=True, text=True, check=True)
    assert float(untuned.stdout) < 10, untuned.stdout  # glibc's default: a block this size goes back at once


def test_the_pool_processes_import_no_beam(tmp_path):
    """What a pool process imports and runs for a local job (stage_chunk) keeps Beam and TF out of it."""
    from tests import corpus

    (tmp_path / "cats").mkdir()
    (tmp_path / "cats" / "a.jpg").write_bytes(corpus.jpeg(64, 48))
    probe = f"""
import sys
from beam_etl import images, records, sharding, workpool
from beam_etl.sources import ImageRef
ref = ImageRef(uri={str(tmp_path / "cats" / "a.jpg")!r}, key="cats/a.jpg", label="cats", split="train", size=0)
settings = records.Settings(policy=images.Policy(), label_ids={{"cats": 0}})
(record, reject, staged), = records.stage_chunk([ref], settings, {str(tmp_path / "chunks")!r})
assert reject is None and staged, (reject, staged)
print(sorted(m for m in sys.modules if m.split('.')[0] in ('apache_beam', 'tensorflow')))
"""
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout[:500]


def test_shutdown_ends_the_forkserver_at_once():
    """shutdown() leaves no forkserver behind, and does not wait for its exit's final collection."""
    from multiprocessing import forkserver

    pool = workpool.OrderedMap(2, abs)
    assert [out for _, out in [*pool.put(-1), *pool.put(-2), *pool.drain()]] == [1, 2]
    server = forkserver._forkserver._forkserver_pid
    assert server and workpool._running(server)
    workpool.shutdown()
    assert forkserver._forkserver._forkserver_pid is None
    assert not workpool._running(server)
