"""The transform graph, prepared beside the job on the launcher's machine.

Importing TensorFlow and tf.Transform takes 3-4 s of one core, and the graph needs only the
training split's summary, known at the end. On the DirectRunner a helper process imports them
while the job runs, then waits for the summary that the publish step hands over in a local
folder, and writes the graph (0.2 s). Elsewhere (Flink, Dataflow) the publishing worker
writes the graph itself.
"""

import json
import logging
import os
import subprocess
import sys
import tempfile
import time

_LOG = logging.getLogger(__name__)
SUMMARY = "summary.json"
DONE = "done.json"  # {"analysis": path, "statistics": {...}} or {"error": text}
_STARTED = {}  # folder -> Popen of each helper this process started


def start():
    """Start the helper; returns (folder, pid). Stop it with stop_all()."""
    folder = tempfile.mkdtemp(prefix="beam-etl-transform-")
    argv = [sys.executable, "-m", "beam_etl.transform_helper", folder]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
    with open(os.path.join(folder, "helper.log"), "wb") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env)
    _STARTED[folder] = proc
    return folder, proc.pid


def stop_all() -> None:
    """End every helper this process started (done or not) and remove its folder."""
    import shutil

    while _STARTED:
        folder, proc = _STARTED.popitem()
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (an exited child its parent has not reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (FileNotFoundError, IndexError):
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False


def _write_json(path: str, value) -> None:
    with open(path + ".partial", "w", encoding="utf-8") as f:
        json.dump(value, f)
    os.replace(path + ".partial", path)  # the reader sees all of it or nothing


def hand_over(folder: str, pid: int, label_names, channels: int, summary: dict, timeout_s: float = 600.0):
    """Give the helper the summary; returns (the graph's folder, its statistics), or None if it could not."""
    _write_json(os.path.join(folder, SUMMARY), {"label_names": list(label_names), "channels": channels, "summary": summary})
    done = os.path.join(folder, DONE)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if os.path.exists(done):
            with open(done, encoding="utf-8") as f:
                result = json.load(f)
            if "analysis" in result:
                return result["analysis"], result["statistics"]
            _LOG.warning("the transform helper failed (%s); the publish step writes the graph itself", result.get("error"))
            return None
        if not _alive(pid) and not os.path.exists(done):
            _LOG.warning("the transform helper (pid %d) exited; the publish step writes the graph itself", pid)
            return None
        time.sleep(0.02)
    _LOG.warning("the transform helper gave no graph in %.0f s; the publish step writes it itself", timeout_s)
    return None


def wait_for_summary(folder: str, parent: int) -> dict:
    """In the helper: block until hand_over's summary arrives; exit when the launcher is gone."""
    path = os.path.join(folder, SUMMARY)
    while not os.path.exists(path):
        if os.getppid() != parent:
            os._exit(1)  # the launcher died: nobody will read what this would write
        time.sleep(0.02)
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def main(argv) -> int:
    folder, parent = argv[0], os.getppid()
    from beam_etl import analyze  # TensorFlow: the slow part, done while the job runs

    handed = wait_for_summary(folder, parent)
    try:
        analysis, statistics = analyze.build(folder, handed["label_names"], handed["channels"], handed["summary"])
    except Exception as e:  # noqa: BLE001 - the publishing worker then writes the graph itself
        _write_json(os.path.join(folder, DONE), {"error": f"{type(e).__name__}: {e}"})
        return 1
    _write_json(os.path.join(folder, DONE), {"analysis": analysis, "statistics": statistics})
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    os._exit(code)  # TensorFlow with Beam can crash in the interpreter's final collection (cli.run)
