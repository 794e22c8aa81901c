"""A small job's fixed cost: `beam-etl convert` against the plain script on 10 photos.

    python bench/startup_bench.py --count 10 --reps 5

Each run is a whole command in its own process session, output to files, interleaved with the
other configuration. Per run: the time from the fork to the first record on disk (a staged chunk
for beam-etl, a non-empty shard for the script), the wall time to exit, the CPU of the command
and the children it waited for, and the processes of its session still running when it returned.
"""

import argparse
import glob
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT]

from tests.test_processes import session_members  # noqa: E402


def first_record(patterns) -> bool:
    return any(os.path.getsize(p) > 0 for pattern in patterns for p in glob.glob(pattern) if os.path.isfile(p))


def run_once(argv, patterns, log, cwd=ROOT):
    started = time.perf_counter()
    with open(log, "wb") as out:
        child = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True)
        first = None
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            now = time.perf_counter() - started
            if pid:
                break
            if first is None and first_record(patterns):
                first = now
            time.sleep(0.01)
    left = len(session_members(child.pid))
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{' '.join(argv)} failed; see {log}")
    return {"wall": now, "first": first if first is not None else now, "cpu": usage.ru_utime + usage.ru_stime, "left": left}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=10)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--num_shards", type=int, default=2)
    p.add_argument("--scratch", default="/tmp/startup_bench")
    p.add_argument("--also", action="append", default=[], help="also run `beam-etl convert` with these extra flags, e.g. '--encode_processes 2'; repeatable")
    p.add_argument("--compare_to", help="also run `beam-etl convert` from this checkout of another commit (`git worktree add DIR REV`)")
    args = p.parse_args(argv)
    shutil.rmtree(args.scratch, ignore_errors=True)
    photos = os.path.join(args.scratch, "photos")
    subprocess.run([sys.executable, os.path.join(HERE, "make_photos.py"), photos, "--count", str(args.count)], check=True,
                   stdout=subprocess.DEVNULL)
    out = os.path.join(args.scratch, "out")
    configs = {
        "beam-etl convert": ([sys.executable, "-m", "beam_etl", "convert", "--input", photos, "--output", out,
                              "--num_shards", str(args.num_shards), "--progress", "none"],
                             [os.path.join(out, ".staging-*", "chunks", "*")]),
        "plain script (bench/baseline.py, Pool(cores))": ([sys.executable, os.path.join(HERE, "baseline.py"), "--input", photos,
                                                          "--output", out, "--num_shards", str(args.num_shards)],
                                                         [os.path.join(out, "*.tfrecord")]),
    }
    for flags in args.also:
        argv_, patterns = configs["beam-etl convert"]
        configs = {f"beam-etl convert {flags}": (argv_ + flags.split(), patterns), **configs}
    cwd = {name: ROOT for name in configs}
    if args.compare_to:
        name = f"beam-etl convert at {os.path.basename(args.compare_to.rstrip('/'))}"
        configs = {name: configs["beam-etl convert"], **configs}
        cwd[name] = args.compare_to
    results = {name: [] for name in configs}
    for rep in range(args.reps):
        for name in (list(configs) if rep % 2 == 0 else list(configs)[::-1]):
            shutil.rmtree(out, ignore_errors=True)
            argv_, patterns = configs[name]
            r = run_once(argv_, patterns, os.path.join(args.scratch, "log.txt"), cwd[name])
            results[name].append(r)
            print(f"# rep {rep + 1} {name:48} first {r['first']:5.2f}s wall {r['wall']:5.2f}s cpu {r['cpu']:5.2f}s left {r['left']}",
                  flush=True)
    shutil.rmtree(args.scratch, ignore_errors=True)
    base = statistics.median(r["wall"] for r in results[list(configs)[-1]])
    print(f"\n{args.count} photos, {args.num_shards} shards, {args.reps} interleaved reps, medians\n")
    print("| command | first record s | wall s | CPU s | wall / script | processes left at exit (max) |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, runs in results.items():
        wall = statistics.median(r["wall"] for r in runs)
        print(f"| {name} | {statistics.median(r['first'] for r in runs):.2f} | {wall:.2f} | "
              f"{statistics.median(r['cpu'] for r in runs):.2f} | {wall / base:.2f}× | {max(r['left'] for r in runs)} |")


if __name__ == "__main__":
    main()
