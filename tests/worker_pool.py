"""Beam's Python SDK worker pool in a process of its own, started as templates/flink's sidecar starts it.

The pool starts each SDK worker as `python -c ...` with the `python` on its PATH. A folder
with a `python` script goes first on that PATH: one that runs this interpreter (which has the
project), or, broken=True, one that runs it without its site-packages, so apache_beam is
missing there as it was on the machine in the issue.
"""

import os
import re
import signal
import subprocess
import sys

from tests.conftest import ROOT
from tests.objstore_servers import _wait_for_port, free_port
from tests.test_templates import TEMPLATES, load_yaml

SIDECAR = "beam-worker-pool"


def sidecar_command() -> list:
    """The TaskManager's worker-pool container: its command and args, from the template."""
    for doc in load_yaml(os.path.join(TEMPLATES, "flink", "flink-session-cluster.yaml")):
        if doc["kind"] != "Deployment":
            continue
        for container in doc["spec"]["template"]["spec"]["containers"]:
            if container["name"] == SIDECAR:
                return [*container["command"], *container["args"]]
    raise AssertionError(f"no {SIDECAR} container in templates/flink")


def children(pid: int) -> list:
    """Live child processes of `pid` (a pool's: the SDK workers it started), from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[1] == str(pid) and fields[0] != "Z":
                found.append(int(entry))
    return found


class WorkerPool:
    def __init__(self, folder, env: dict, broken: bool = False):
        self.port = free_port()
        bin_dir = os.path.join(folder, "bin")
        os.makedirs(bin_dir, exist_ok=True)
        python = os.path.join(bin_dir, "python")
        with open(python, "w") as f:  # -S: no site-packages; -E: no PYTHONPATH
            f.write(f'#!/bin/sh\nexec "{sys.executable}" {"-S -E " if broken else ""}"$@"\n')
        os.chmod(python, 0o755)
        command = [re.sub(r"^--service_port=\d+$", f"--service_port={self.port}", a) for a in sidecar_command()]
        assert command[0] == "python"
        command[0] = sys.executable  # the pool itself runs; only the workers it starts get the PATH's python
        self.log_path = os.path.join(folder, "worker-pool.log")
        self.log = open(self.log_path, "wb")
        env = dict(env, PATH=bin_dir + os.pathsep + os.environ["PATH"], TF_CPP_MIN_LOG_LEVEL="2")
        env.setdefault("PYTHONPATH", ROOT)
        self.proc = subprocess.Popen(command, env=env, cwd=folder, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        _wait_for_port(self.port, self.proc, "the SDK worker pool")
        self.address = f"localhost:{self.port}"

    def flags(self, workers: int = 2) -> list:
        """The launcher's flags for this pool: the embedded job service, EXTERNAL, `workers` workers."""
        return ["--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=EXTERNAL",
                f"--environment_config={self.address}", f"--direct_num_workers={workers}"]

    def text(self) -> str:
        self.log.flush()
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def started_workers(self) -> list:
        """The worker ids the pool started, from its log."""
        return re.findall(r'worker_id="([^"]+)"', self.text())

    def close(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the pool and every worker it started
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.log.close()
