"""Progress of a running conversion: a bar on a terminal, log lines otherwise, the job's address on remote runners.

The DirectRunner (FnApiRunner) runs the whole job inside `p.run()` and its metrics are
complete only when it returns, so live counts travel by a side channel: each encoding
DoFn instance rewrites one tiny JSON file of its counts at most once a second, and the
launcher sums them. The total is a second listing of the inputs in the launcher, done
in the polling thread while the pipeline runs.
"""

import json
import os
import sys
import threading
import time
import uuid

MODES = ("auto", "bar", "log", "none")
NAMESPACE = "beam_etl"  # of the Beam counters that transforms.py keeps and final_counts reads
FLUSH_SECONDS = 1.0  # how often one DoFn instance rewrites its file: a few writes a second in all, whatever the rate


class Tally:
    """One DoFn instance's counts, rewritten atomically to its own file in `folder`, at most every FLUSH_SECONDS."""

    def __init__(self, folder: str):
        self.folder = folder
        self.path = os.path.join(folder, f"{uuid.uuid4().hex}.json")
        self.encoded = self.rejected = 0
        self.last = 0.0

    def add(self, encoded: int = 0, rejected: int = 0) -> None:
        self.encoded += encoded
        self.rejected += rejected
        if time.monotonic() - self.last >= FLUSH_SECONDS:
            self.flush()

    def flush(self) -> None:
        self.last = time.monotonic()
        os.makedirs(self.folder, exist_ok=True)
        temp = f"{self.path}.tmp"
        with open(temp, "w", encoding="utf-8") as f:
            f.write(json.dumps({"encoded": self.encoded, "rejected": self.rejected}))
        os.replace(temp, self.path)  # a reader sees the old counts or the new, never half a file


class _NoTally:
    def add(self, encoded: int = 0, rejected: int = 0) -> None:
        pass

    def flush(self) -> None:
        pass


def progress_folder(staging: str):
    """Where the Tally files of a run go: inside its staging folder, when that is local (None on gs://, s3://)."""
    return None if "://" in staging else os.path.join(staging, "progress")


def tally(folder):
    """A Tally writing into `folder`, or one that does nothing when folder is None (progress off, or a remote runner)."""
    return Tally(folder) if folder else _NoTally()


def read_counts(folder: str) -> tuple:
    """(encoded, rejected) summed over the Tally files in `folder`; (0, 0) before any exists or after publishing removed them."""
    encoded = rejected = 0
    try:
        names = [n for n in os.listdir(folder) if n.endswith(".json")]
    except FileNotFoundError:
        return 0, 0
    for name in names:
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                counts = json.loads(f.read())
        except (FileNotFoundError, json.JSONDecodeError):
            continue  # removed with the staging folder at the end
        encoded += counts.get("encoded", 0)
        rejected += counts.get("rejected", 0)
    return encoded, rejected


def count_inputs(uris) -> int:
    """How many inputs the pipeline's listing step will produce: the same listing, run in the launcher."""
    from beam_etl import sources

    return sum(1 for uri in uris for _ in sources.listing(uri))


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Rate:
    """images/s since the first image was done, so the pipeline's start-up does not drag the rate down.

    It holds still while no more images are done (the shard writing after the encoding),
    so the rate shown is the encoding rate.
    """

    def __init__(self):
        self.start = None  # (time, done) of the first observation with work done
        self.last = (0, None)  # (done, rate) of the latest observation that moved

    def update(self, now: float, done: int):
        """images/s, or None until two observations give one."""
        if self.start is None:
            if done:
                self.start = (now, done)
            return None
        t0, d0 = self.start
        if done <= self.last[0] or now <= t0 or done <= d0:
            return self.last[1]
        self.last = (done, (done - d0) / (now - t0))
        return self.last[1]


def status(done: int, rejected: int, total, rate, elapsed: float) -> dict:
    """The numbers of one progress report; total None while the launcher is still counting."""
    eta = None
    if total and rate:
        eta = max(total - done, 0) / rate
    return {"done": done, "total": total, "rejected": rejected, "rate": rate, "eta": eta, "elapsed": elapsed}


def log_line(s: dict, final: bool = False) -> str:
    """One progress line for logs: '3200/5000 images (64%), 145 images/s, 3 rejected, ETA 0:12 [0:30 elapsed]'."""
    if final:
        rate = f", {s['rate']:.0f} images/s while encoding" if s["rate"] else ""
        return f"done: {s['done']} images, {s['rejected']} rejected{rate}, {_duration(s['elapsed'])} from the start of the job"
    if s["total"] is None:
        done = f"{s['done']}/? images"
    else:
        done = f"{s['done']}/{s['total']} images ({100 * s['done'] / s['total'] if s['total'] else 100:.0f}%)"
    rate = f"{s['rate']:.0f} images/s" if s["rate"] else "? images/s"
    if s["total"] is not None and s["done"] >= s["total"]:
        eta = "encoding done; writing shards and statistics"
    else:
        eta = f"ETA {_duration(s['eta'])}" if s["eta"] is not None else "ETA ?"
    return f"{done}, {rate}, {s['rejected']} rejected, {eta} [{_duration(s['elapsed'])} elapsed]"


def bar_line(s: dict, final: bool = False, width: int = 30) -> str:
    """The same as log_line with a bar in front, for a terminal."""
    fraction = min(s["done"] / s["total"], 1.0) if s["total"] else 0.0
    filled = int(fraction * width)
    return f"[{'#' * filled}{'.' * (width - filled)}] {log_line(s, final)}"


def resolve_mode(mode: str, stream) -> str:
    """auto: a bar on a terminal, log lines when the output goes to a file or a pipe."""
    if mode != "auto":
        return mode
    return "bar" if hasattr(stream, "isatty") and stream.isatty() else "log"


class Reporter:
    """Polls the Tally files from a daemon thread while `p.run()` blocks, and reports."""

    def __init__(self, mode: str, folder: str, inputs, interval: float = 0.0, stream=None):
        self.stream = stream or sys.stderr
        self.mode = resolve_mode(mode, self.stream)
        self.folder = folder
        self.inputs = inputs
        self.interval = interval or (0.5 if self.mode == "bar" else 10.0)
        self.total = None
        self.rate = Rate()
        self.started = time.monotonic()
        self.stop_event = threading.Event()
        self.thread = None
        self.last_done = 0

    def __enter__(self):
        if self.mode != "none" and self.folder:
            self.thread = threading.Thread(target=self._run, name="beam-etl-progress", daemon=True)
            self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop_event.set()
        if self.thread:
            self.thread.join()
            if self.mode == "bar" and self.last_done:
                self._write("\n")  # the job failed mid-bar: its error goes on a line of its own
        return False

    def _count(self):
        from beam_etl import sources

        try:
            self.total = count_inputs(self.inputs)
        except (OSError, sources.InputError) as e:  # the pipeline's own listing reports the problem
            self._write(f"beam-etl: progress: cannot count the inputs ({e}); showing counts without a total\n")

    def _run(self):
        counter = threading.Thread(target=self._count, name="beam-etl-count", daemon=True)
        counter.start()
        while not self.stop_event.wait(self.interval):
            self.report(*read_counts(self.folder))

    def report(self, encoded: int, rejected: int, final: bool = False) -> None:
        done = encoded + rejected
        if not final and done < self.last_done:
            return  # the staging folder is gone: the run is publishing, and the final report follows
        self.last_done = done
        now = time.monotonic()
        rate = self.rate.update(now, done)
        s = status(done, rejected, self.total if not final else max(self.total or 0, done), rate, now - self.started)
        if self.mode == "bar":
            self._write("\r" + bar_line(s, final) + "\x1b[K" + ("\n" if final else ""))  # \x1b[K: clear what a longer line left
        elif self.mode == "log":
            self._write(f"beam-etl: progress: {log_line(s, final)}\n")

    def finish(self, result) -> None:
        """The last report, from the job's Beam metrics, which are complete once it has finished."""
        if self.mode == "none" or not self.folder:
            return
        self.stop_event.set()
        if self.thread:
            self.thread.join()
            self.thread = None
        encoded, rejected = final_counts(result)
        self.report(encoded, rejected, final=True)

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()


def final_counts(result) -> tuple:
    """(images_encoded, images_rejected) from the finished job's Beam counters."""
    return _summed(result, "images_encoded"), _summed(result, "images_rejected")


def counter_total(result, name: str) -> int:
    """One of this project's Beam counters, summed over steps; 0 where the runner reports none."""
    try:
        return _summed(result, name)
    except (AttributeError, NotImplementedError):  # a runner without metrics
        return 0


def _summed(result, name: str) -> int:
    from apache_beam.metrics.metric import MetricsFilter

    counters = result.metrics().query(MetricsFilter().with_namespace(NAMESPACE).with_name(name))["counters"]
    return sum((c.committed if c.committed is not None else c.attempted) or 0 for c in counters)


def watch_lines(result, options) -> list:
    """Where to watch a job on a remote runner: its id and, for Dataflow, the console address."""
    from apache_beam.options.pipeline_options import GoogleCloudOptions, StandardOptions

    runner = (options.view_as(StandardOptions).runner or "").split(".")[-1]
    job_id = None
    if hasattr(result, "job_id"):
        try:
            job_id = result.job_id()
        except (AttributeError, NotImplementedError):  # a runner that has no job id
            job_id = None
    lines = [f"beam-etl: submitted to {runner or 'the runner'}" + (f" as job {job_id}" if job_id else "")]
    if runner in ("DataflowRunner", "dataflow") and job_id:
        gcp = options.view_as(GoogleCloudOptions)
        lines.append(f"beam-etl: watch it at https://console.cloud.google.com/dataflow/jobs/{gcp.region}/{job_id}?project={gcp.project}")
    elif runner in ("FlinkRunner", "flink"):
        master = options.get_all_options().get("flink_master") or "[auto]"
        where = f"the Flink web UI at http://{master}" if master not in ("[auto]", "[local]") else "the Flink web UI of the cluster (--flink_master)"
        lines.append(f"beam-etl: watch it in {where}")
    return lines


def direct_mode(options):
    """The DirectRunner's running mode (in_memory unless set), or None when another runner runs the job."""
    from apache_beam.options.pipeline_options import DirectOptions

    if not is_direct(options):
        return None
    return options.view_as(DirectOptions).direct_running_mode or "in_memory"


DIRECT_RUNNERS = ("DirectRunner", "direct", "SwitchingDirectRunner", "BundleBasedDirectRunner")


def is_direct(options) -> bool:
    from apache_beam.options.pipeline_options import StandardOptions

    runner = options.view_as(StandardOptions).runner
    return runner is None or str(runner).split(".")[-1] in DIRECT_RUNNERS
