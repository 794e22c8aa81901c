"""The per-image work in a pool of processes, in input order, a bounded number of chunks in flight. No Beam.

Why: the DirectRunner runs Python DoFns on one core (in_memory) or pays a gRPC hop per
element and a full copy of the job per worker (multi_processing). Decoding is the cost, so
the encode step hands it to worker processes and keeps everything else where it is.
"""

import collections
import concurrent.futures
import multiprocessing
import os
import signal
import threading
import time

_POOLS = {}  # processes -> ProcessPoolExecutor, shared by every DoFn instance of this process


class WorkerDied(RuntimeError):
    """A pool process died (killed for memory, or a crash in a native library) while working on some items."""


def cores() -> int:
    """The cores this process may run on (cgroup and affinity aware where the OS says)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def _context():
    # Not fork: the parent has TensorFlow's and gRPC's threads, which a fork copies half-way.
    # forkserver imports the worker modules once and forks clean children from that.
    method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    return multiprocessing.get_context(method)


def executor(processes: int, preload=("beam_etl.records", "beam_etl.sharding")) -> concurrent.futures.ProcessPoolExecutor:
    """The shared pool of `processes` workers, started on first use."""
    pool = _POOLS.get(processes)
    if pool is None:
        context = _context()
        if context.get_start_method() == "forkserver":
            context.set_forkserver_preload(list(preload))
        pool = _POOLS[processes] = concurrent.futures.ProcessPoolExecutor(processes, mp_context=context, initializer=_leave_with, initargs=(os.getpid(),))
    return pool


# glibc's malloc, in each pool process (mallopt). Left to its defaults it hands every freed
# block of more than 128 KB (an image's bytes, its decoded pixels, a chunk being joined) back
# to the kernel and maps fresh pages for the next: measured at 10k photos, the pool spent 6.0
# core-s in the kernel and 18.4 in user space; with these, 2.5 and 16.1, and the whole command
# went from 16.1 to 13.1 s (docs/BENCHMARKS.md §15). What it keeps is bounded by TRIM per process.
MALLOC_MMAP_THRESHOLD = 64 << 20  # only allocations above this get their own mapping
MALLOC_TRIM_THRESHOLD = 256 << 20  # free memory at the top of the heap kept for reuse, at most
MALLOC_TOP_PAD = 64 << 20  # grow the heap in steps this large
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3  # glibc's malloc.h


def tune_malloc() -> bool:
    """Keep freed memory for reuse instead of returning it to the kernel each time; False where not glibc."""
    import ctypes
    import ctypes.util

    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):  # macOS, musl: their allocators, their defaults
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return all(mallopt(param, value) == 1 for param, value in (
        (_M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD), (_M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD), (_M_TOP_PAD, MALLOC_TOP_PAD)))


def _leave_with(launcher: int) -> None:
    """In each worker: keep freed memory (tune_malloc), and exit once the launcher is gone.

    A launcher killed by SIGTERM, SIGKILL or the OOM killer cleans nothing up, and its
    workers would wait for work forever, holding the forkserver alive with them (seen here).
    """
    tune_malloc()

    def watch():
        while True:
            time.sleep(1.0)
            if not _running(launcher):
                os._exit(0)

    threading.Thread(target=watch, name="workpool-watch", daemon=True).start()


def _running(pid: int) -> bool:
    """Whether the process exists and has not exited (a zombie, not yet reaped by its parent, has)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's: it exists
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:  # no /proc (macOS): kill(0) is all there is
        return True


def _noop():
    return os.getpid()


def warm(processes: int) -> None:
    """Start the pool's processes in the background now, so their start-up overlaps the launcher's."""
    pool = executor(processes)

    def start():
        try:
            for _ in range(processes):
                pool.submit(_noop)  # each submit starts one more worker until there are `processes`
        except RuntimeError:  # shut down meanwhile: the launcher is leaving
            pass

    # A submit waits until the forkserver has imported the worker modules (~2 s): not on this thread.
    threading.Thread(target=start, name="workpool-warm", daemon=True).start()


def shutdown() -> None:
    """Stop every pool of this process, and the helper processes multiprocessing started for them.

    The launcher calls it before exiting. Left to themselves, the forkserver and the resource
    tracker exit only after the launcher has (they see their pipe close), so a caller that
    runs `convert && train` would find them still running when its next command starts.
    """
    while _POOLS:
        _, pool = _POOLS.popitem()
        pool.shutdown(wait=True, cancel_futures=True)
    from multiprocessing import forkserver, resource_tracker

    server = getattr(forkserver._forkserver, "_forkserver_pid", None)
    if server is not None:
        # Its children are gone (shutdown waited), and it holds nothing to save; left to exit by
        # itself it spends seconds in the interpreter's final collection of what it imported.
        try:
            os.kill(server, signal.SIGKILL)
        except OSError:  # already gone
            pass
    for helper in (forkserver._forkserver, resource_tracker._resource_tracker):
        stop = getattr(helper, "_stop", None)  # private, in CPython since 3.8: close its pipe, reap it
        if stop is not None:
            try:
                stop()
            except (OSError, ChildProcessError):  # already gone
                pass


def _discard(processes: int) -> None:
    pool = _POOLS.pop(processes, None)
    if pool is not None:
        pool.shutdown(wait=False, cancel_futures=True)


def _run_chunk(fn, items):
    return [fn(item) for item in items]


def _run_whole_chunk(fn, items):
    results = fn(items)
    if len(results) != len(items):
        raise RuntimeError(f"{fn!r} gave {len(results)} results for {len(items)} items")
    return results


class OrderedMap:
    """fn over items in a process pool, in chunks; yields (item, fn(item)) in input order.

    At most `max_chunks` chunks are in flight, so memory is bounded by
    chunk_size * max_chunks results whatever the input size. per_chunk: fn takes a whole
    chunk and returns its results in order (to overlap work inside a chunk).
    """

    def __init__(self, processes: int, fn, chunk_size: int = 64, max_chunks: int = 0, describe=repr, per_chunk: bool = False):
        self.processes, self.fn, self.chunk_size = processes, fn, chunk_size
        self.run = _run_whole_chunk if per_chunk else _run_chunk
        self.max_chunks = max_chunks or 3 * processes  # enough to keep every worker busy while the caller works
        self.describe = describe
        self.pool = executor(processes)
        self.chunk, self.pending = [], collections.deque()  # pending: (items, future)

    def put(self, item):
        """Queue one item; yields the results that are ready (waits when too many are in flight)."""
        self.chunk.append(item)
        if len(self.chunk) >= self.chunk_size:
            self._submit()
        while self.pending and (len(self.pending) > self.max_chunks or self.pending[0][1].done()):
            yield from self._pop()

    def drain(self):
        """Yields every remaining result, waiting for them."""
        if self.chunk:
            self._submit()
        while self.pending:
            yield from self._pop()

    def _submit(self):
        items, self.chunk = self.chunk, []
        try:
            future = self.pool.submit(self.run, self.fn, items)
        except concurrent.futures.process.BrokenProcessPool:
            self._broken(items)
        self.pending.append((items, future))

    def _pop(self):
        items, future = self.pending.popleft()
        try:
            results = future.result()
        except concurrent.futures.process.BrokenProcessPool:
            self._broken(items)
        yield from zip(items, results)

    def _broken(self, items):
        _discard(self.processes)  # a retry gets a fresh pool
        first = self.describe(items[0]) if items else "?"
        raise WorkerDied(
            f"a worker process died (killed for memory, or a crash in an image library) while working on {len(items)} "
            f"items starting with {first}; rerun with --encode_processes 0 to do the work in the Beam worker and find the input"
        ) from None
