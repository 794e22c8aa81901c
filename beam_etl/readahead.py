"""Reads kept in flight ahead of the work that needs them, on threads, in input order. No Beam.

Why: an object store answers each request in 10-50 ms. Read one image after another and a
worker waits that long per image, however fast it decodes; with N reads in flight the wait
overlaps N-1 other reads and the decode. Threads suffice: a read waits on the network, and
the HTTP clients release the GIL while they wait.
"""

import collections
import concurrent.futures
import threading

_POOLS = {}  # depth -> ThreadPoolExecutor, shared by every ReadAhead of this process
_LOCK = threading.Lock()


def _threads(depth: int) -> concurrent.futures.ThreadPoolExecutor:
    with _LOCK:
        pool = _POOLS.get(depth)
        if pool is None:
            pool = _POOLS[depth] = concurrent.futures.ThreadPoolExecutor(depth, thread_name_prefix="readahead")
        return pool


class ReadAhead:
    """read(item) on `depth` threads; yields (item, Future of read(item)) in input order.

    At most `depth` reads are pending beyond the one the caller is working on, so memory is
    bounded by depth results whatever the input size. depth <= 1 reads inline, one at a time.
    """

    def __init__(self, read, depth: int):
        self.read, self.depth = read, depth
        self.pending = collections.deque()  # (item, future)
        self.pool = _threads(depth) if depth > 1 else None

    def put(self, item):
        """Start reading `item`; yields the reads that are done, or the oldest once `depth` are pending."""
        self.pending.append((item, self._start(item)))
        while self.pending and (len(self.pending) > self.depth or self.pending[0][1].done()):
            yield self.pending.popleft()

    def drain(self):
        """Yields every remaining read, oldest first (the caller waits on each Future)."""
        while self.pending:
            yield self.pending.popleft()

    def _start(self, item) -> concurrent.futures.Future:
        if self.pool is not None:
            return self.pool.submit(self.read, item)
        future = concurrent.futures.Future()
        try:
            future.set_result(self.read(item))
        except Exception as e:  # noqa: BLE001 - handed to the caller with the item, as a thread would
            future.set_exception(e)
        return future


def done(value) -> concurrent.futures.Future:
    """A Future that already holds `value`."""
    future = concurrent.futures.Future()
    future.set_result(value)
    return future


def each(read, items, depth: int):
    """ReadAhead over an iterable: yields (item, Future) in input order."""
    reads = ReadAhead(read, depth)
    for item in items:
        yield from reads.put(item)
    yield from reads.drain()
