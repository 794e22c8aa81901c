"""The per-image work in a pool of processes, in input order, a bounded number of chunks in flight. No Beam.

Why: the DirectRunner runs Python DoFns on one core (in_memory) or pays a gRPC hop per
element and a full copy of the job per worker (multi_processing). Decoding is the cost, so
the encode step hands it to worker processes and keeps everything else where it is.
"""

import collections
import concurrent.futures
import contextlib
import multiprocessing
import os
import signal
import threading
import time

_POOLS = {}  # processes -> ProcessPoolExecutor, shared by every DoFn instance of this process
_IN_POOL = False  # True in a pool process: only there may limits() cap memory and end the process


class WorkerDied(RuntimeError):
    """A pool process died (killed for memory, or a crash in a native library) while working on some items."""


def cores() -> int:
    """The cores this process may run on (cgroup and affinity aware where the OS says)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def memory_bytes() -> int:
    """This machine's memory, or the container's where a cgroup caps it lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                total = min(total, int(f.read().strip()))
        except (OSError, ValueError):  # none, or "max"
            pass
    return total


def default_memory_limit(processes: int) -> int:
    """The memory cap of each encode-pool process (workpool.limits): half the memory, over the processes."""
    return max(1 << 30, memory_bytes() // (2 * max(1, processes)))


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
# Each thread that allocates would get an arena of its own, up to 8 per core, each of which maps
# 64 MB: with 16 reading threads that is 1.1 GB of a process's data before any image, all of it
# counted by limits()'s cap (seen: "can't start new thread" under a 1 GB cap). The readers
# allocate little; two arenas serve them.
MALLOC_ARENA_MAX = 2
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -2, -3, -8  # glibc's malloc.h


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
        (_M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD), (_M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD), (_M_TOP_PAD, MALLOC_TOP_PAD),
        (_M_ARENA_MAX, MALLOC_ARENA_MAX)))


def _leave_with(launcher: int) -> None:
    """In each worker: keep freed memory (tune_malloc), and exit once the launcher is gone.

    A launcher killed by SIGTERM, SIGKILL or the OOM killer cleans nothing up, and its
    workers would wait for work forever, holding the forkserver alive with them (seen here).
    """
    global _IN_POOL
    _IN_POOL = True
    tune_malloc()
    signal.signal(signal.SIGALRM, signal.SIG_DFL)  # limits()'s hard time limit ends the process

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


_MEMORY_SET = [None]  # the memory cap this process has set


@contextlib.contextmanager
def limits(hard_timeout_s: float, memory_bytes: int = 0):
    """In a pool process: the work inside runs under a memory cap and a hard time limit.

    The cap is RLIMIT_DATA, the process's private data (the heap, numpy's and Pillow's image
    memory, thread stacks), not RLIMIT_AS, which also counts what is only reserved. An
    allocation past it fails with MemoryError, which the work reports as a reject. The time
    limit is SIGALRM left to its default action: it ends the process even inside a C call that
    never returns to Python, and OrderedMap then runs the inputs again and finds the one that
    did it. Anywhere else (a Beam worker, a test) nothing is set.
    """
    if not _IN_POOL:
        yield
        return
    if memory_bytes and _MEMORY_SET[0] != memory_bytes:
        import resource

        hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
        resource.setrlimit(resource.RLIMIT_DATA, (memory_bytes if hard == resource.RLIM_INFINITY else min(memory_bytes, hard), hard))
        _MEMORY_SET[0] = memory_bytes
    signal.setitimer(signal.ITIMER_REAL, hard_timeout_s)  # SIGALRM is at its default (_leave_with)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def in_pool() -> bool:
    """Whether this process is a pool process (or run_alone's), where limits() applies."""
    return _IN_POOL


def _alone(conn, launcher: int, call, args) -> None:
    """In a fresh process: call(*args), the result or the exception sent back on conn."""
    _leave_with(launcher)
    try:
        outcome = ("ok", call(*args))
    except BaseException as e:  # noqa: BLE001 - the caller raises it, as the pool would have
        outcome = ("raised", e)
    conn.send(outcome)
    conn.close()


def run_alone(call, *args):
    """call(*args) in a fresh process of its own: ("ok", result), or ("died", the signal or exit code)."""
    context = _context()
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_alone, args=(send, os.getpid(), call, args), daemon=True)
    process.start()
    send.close()
    try:
        kind, value = receive.recv()
    except EOFError:  # it died before sending
        kind, value = "died", None
    finally:
        receive.close()
        process.join()
    if kind == "raised":
        raise value
    if kind == "died":
        code = process.exitcode
        return "died", signal.Signals(-code).name if code is not None and code < 0 else f"exit code {code}"
    return kind, value


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


MAX_DEATHS, MAX_DEATHS_PER_ITEM = 10, 0.01  # past 10 + 1% of the items, process deaths fail the map


class OrderedMap:
    """fn over items in a process pool, in chunks; yields (item, fn(item)) in input order.

    At most `max_chunks` chunks are in flight, so memory is bounded by
    chunk_size * max_chunks results whatever the input size. per_chunk: fn takes a whole
    chunk and returns its results in order (to overlap work inside a chunk).

    A pool process that dies (a crash in a native library, the OOM killer, an operator's kill)
    costs its inputs one rerun, not the job: the pool is replaced, and each chunk it held runs
    again in a fresh process of its own; a chunk that kills that one too runs an item at a
    time, each alone, and an item that kills its process by itself gets on_crash(item, signal
    name) as its result (None: WorkerDied is raised). `lost` counts the processes that died.
    """

    def __init__(self, processes: int, fn, chunk_size: int = 64, max_chunks: int = 0, describe=repr, per_chunk: bool = False, on_crash=None):
        self.processes, self.fn, self.chunk_size = processes, fn, chunk_size
        self.run = _run_whole_chunk if per_chunk else _run_chunk
        self.max_chunks = max_chunks or 3 * processes  # enough to keep every worker busy while the caller works
        self.describe, self.on_crash = describe, on_crash
        self.pool = executor(processes)
        self.chunk, self.pending = [], collections.deque()  # pending: (items, future, pool)
        self.lost = 0  # since the caller last took it (transforms.count_lost)
        self.deaths, self.items = 0, 0  # over this map's life: a pool that can't keep a process alive fails

    def put(self, item):
        """Queue one item; yields the results that are ready (waits when too many are in flight)."""
        self.items += 1
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
        except concurrent.futures.process.BrokenProcessPool:  # broke since the last result was taken
            self._replace(self.pool)
            future = self.pool.submit(self.run, self.fn, items)
        self.pending.append((items, future, self.pool))

    def _pop(self):
        items, future, pool = self.pending.popleft()
        try:
            results = future.result()
        except (concurrent.futures.process.BrokenProcessPool, concurrent.futures.CancelledError):  # cancelled: by _discard
            self._replace(pool)
            results = self._alone(items)
        yield from zip(items, results)

    def _replace(self, broken) -> None:
        """A fresh pool for what comes next, once per broken pool; every chunk in flight is rerun."""
        if broken is self.pool:
            self._died("a pool process")
            _discard(self.processes)
            self.pool = executor(self.processes)

    def _died(self, what: str) -> None:
        self.lost += 1
        self.deaths += 1
        if self.deaths > MAX_DEATHS + self.items * MAX_DEATHS_PER_ITEM:
            raise WorkerDied(f"{self.deaths} worker processes died over {self.items} items, the last {what}: not a bad input but "
                             "something that kills every process (memory, the environment); see the log above")

    def _alone(self, items) -> list:
        """The results of items that were in a pool when a process died: run again, alone."""
        outcome, value = run_alone(self.run, self.fn, items)
        if outcome == "ok":
            return value
        self._died(f"with {value} on {self.describe(items[0])}")
        if len(items) > 1:
            return [result for item in items for result in self._alone([item])]
        if self.on_crash is None:
            raise WorkerDied(f"a worker process died with {value} while working on {self.describe(items[0])}, twice: "
                             "the second time alone in a fresh process")
        return [self.on_crash(items[0], value)]
