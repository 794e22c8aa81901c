"""Per-process CPU of a command's process tree over time: the launcher against its children.

    python bench/cpu_timeline.py --step 10 -- beam-etl convert --input /tmp/photos50k --output /tmp/out --num_shards 8

Samples user and system CPU seconds of every process in the tree once a second (psutil) and
prints, per interval, the core-seconds spent by the root process and by all the others
(encode pool, forkserver). A phase where only the root works, or where system time
dominates, shows up as a row. A child's CPU after the last sample before it exits (under a
second) is not counted.
"""

import argparse
import subprocess
import sys
import time

import psutil


def sample(root: psutil.Process) -> dict:
    """{pid: (user, system)} for the process tree now."""
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return {}
    out = {}
    for proc in procs:
        try:
            times = proc.cpu_times()
            out[proc.pid] = (times.user, times.system)
        except psutil.Error:
            pass
    return out


def split(snap: dict, root_pid: int) -> tuple:
    """(root user, root system, others user, others system)."""
    ru, rs = snap.get(root_pid, (0.0, 0.0))
    others = [v for pid, v in snap.items() if pid != root_pid]
    return ru, rs, sum(u for u, _ in others), sum(s for _, s in others)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--step", type=int, default=5, help="seconds per printed row")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("give the command after --")
    started = time.time()
    child = subprocess.Popen(command)
    root = psutil.Process(child.pid)
    rows, seen = [], {}  # seen: pid -> last (user, system), so that exited children still count
    while child.poll() is None:
        seen.update(sample(root))
        rows.append((time.time() - started, split(seen, child.pid)))
        time.sleep(1)
    wall = time.time() - started
    rows.append((wall, rows[-1][1] if rows else (0.0, 0.0, 0.0, 0.0)))
    print(f"\n{' '.join(command)}\nexit {child.returncode}, wall {wall:.1f} s; core-seconds per interval\n")
    print("| until s | root user | root system | others user | others system |")
    print("|---:|---:|---:|---:|---:|")
    previous = (0.0, 0.0, 0.0, 0.0)
    for i, (t, totals) in enumerate(rows):
        if i % args.step == args.step - 1 or i == len(rows) - 1:
            print(f"| {t:.0f} | " + " | ".join(f"{a - b:.1f}" for a, b in zip(totals, previous)) + " |")
            previous = totals
    print("| total | " + " | ".join(f"{v:.1f}" for v in previous) + " |")
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
