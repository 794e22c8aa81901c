"""`beam-etl convert` returns only after every process it started has exited."""

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.corpus import make_folder


def session_members(session: int) -> list:
    """(pid, command line) of every live process in this session; zombies have exited."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if fields[3] == str(session) and fields[0] != "Z":
            found.append((int(entry), command[:200]))
    return found


@pytest.mark.parametrize("outcome", ["success", "failure"])
def test_convert_leaves_no_process_running(outcome, tmp_path):
    # Its own session: every process it starts (the pool, the forkserver, the resource tracker)
    # stays in it unless it leaves on purpose, so the session lists them after the command returns.
    src = tmp_path / "src"
    make_folder(src, extra={"ant/broken.jpg": b"not a jpeg"} if outcome == "failure" else ())
    strict = ["--max_reject_fraction", "0"] if outcome == "failure" else []  # one reject fails the job, after the encode
    # Output to files, not pipes: reading a pipe to its end would wait for every process that
    # inherited it, which a shell running `convert && train` does not do.
    with open(tmp_path / "out.txt", "wb") as out, open(tmp_path / "err.txt", "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "beam_etl", "convert", "--input", str(src), "--output", str(tmp_path / "out"),
                                 "--num_shards", "2", "--encode_processes", "2", *strict],
                                cwd=ROOT, stdout=out, stderr=err, start_new_session=True)
        code = proc.wait(timeout=600)
    left = session_members(proc.pid)  # at once, as the shell's next command would start
    assert code == (0 if outcome == "success" else 1), (tmp_path / "err.txt").read_text()[-2000:]
    assert left == [], left
