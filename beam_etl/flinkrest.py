"""Flink's REST API, as `convert` and the benchmarks use it: reach the cluster, find a job, cancel it, count its bytes.

Beam's job server does not stop a Flink job when its client goes away: its cancel interrupts
only its own wait for the job (measured: the job stayed RUNNING, holding its slots). So the
launcher names each job it submits and cancels it here, on the cluster, by that name.
"""

import json
import urllib.error
import urllib.request

RUNNING_STATES = ("INITIALIZING", "CREATED", "RUNNING", "FAILING", "RESTARTING", "CANCELLING", "RECONCILING")


class Unreachable(OSError):
    """No Flink REST API answers at the address."""


def master(options):
    """http://host:port of --flink_master, or None when it is not set (or Beam's [auto]/[local])."""
    from apache_beam.options.pipeline_options import FlinkRunnerOptions

    value = (options.view_as(FlinkRunnerOptions).flink_master or "").strip()
    if not value or value.startswith("["):
        return None
    return value.rstrip("/") if "://" in value else f"http://{value.rstrip('/')}"


def _call(url: str, method: str = "GET", timeout: float = 5.0):
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise Unreachable(f"{url}: {reason}") from None
    return json.loads(body) if body else {}


def check(base: str) -> dict:
    """The cluster's overview (taskmanagers, slots); Unreachable within seconds when none answers."""
    return _call(base + "/overview", timeout=3.0)


def jobs_named(base: str, name: str) -> list:
    """[{jid, name, state}] of the cluster's jobs with this name, newest first."""
    jobs = _call(base + "/jobs/overview").get("jobs", [])
    return sorted((j for j in jobs if j.get("name") == name), key=lambda j: -j.get("start-time", 0))


def cancel(base: str, jid: str) -> None:
    _call(f"{base}/jobs/{jid}?mode=cancel", method="PATCH")


def cancel_named(base: str, name: str) -> tuple:
    """Cancel every job of this name that has not ended; ([(jid, state before)], whether any was found)."""
    found = jobs_named(base, name)
    cancelled = []
    for job in found:
        if job["state"] in RUNNING_STATES:
            cancel(base, job["jid"])
            cancelled.append((job["jid"], job["state"]))
    return cancelled, bool(found)


def job(base: str, jid: str) -> dict:
    return _call(f"{base}/jobs/{jid}")


def bytes_between_tasks(base: str, jid: str) -> dict:
    """Bytes that the job's tasks read from and wrote to Flink's data exchange, summed over vertices."""
    vertices = job(base, jid).get("vertices", [])
    totals = {"read-bytes": 0, "write-bytes": 0, "vertices": len(vertices)}
    for vertex in vertices:
        for key in ("read-bytes", "write-bytes"):
            totals[key] += int(vertex.get("metrics", {}).get(key, 0))
    return totals
