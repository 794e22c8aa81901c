"""Two checkouts of beam-etl and the full-decode script, interleaved, whole-process wall time.

    git worktree add /tmp/old e85cf23
    python bench/ab_trees.py --input /tmp/photos50k --old /tmp/old --reps 3

Each rep runs the old checkout's `beam-etl convert`, this checkout's, then bench/baseline.py
(Pool of every core), each after `sync; sleep 3` and a read of every input (page cache warm),
with --num_shards 8, and prints the medians and each one's ratio to the script.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", required=True)
    p.add_argument("--old", required=True, help="another checkout of this repository (git worktree add)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--scratch", default="/tmp/ab_trees")
    args = p.parse_args(argv)
    out = os.path.join(args.scratch, "out")
    os.makedirs(args.scratch, exist_ok=True)
    convert = [sys.executable, "-m", "beam_etl", "convert", "--input", args.input, "--output", out, "--num_shards", "8", "--progress", "none"]
    configs = {
        "old": (convert, {"PYTHONPATH": os.path.abspath(args.old)}),
        "new": (convert, {"PYTHONPATH": os.path.dirname(HERE)}),
        "script": ([sys.executable, os.path.join(HERE, "baseline.py"), "--input", args.input, "--output", out, "--num_shards", "8",
                    "--workers", str(os.cpu_count() or 1)], {}),
    }
    walls = {name: [] for name in configs}
    for rep in range(args.reps):
        for name, (argv_, env) in configs.items():
            shutil.rmtree(out, ignore_errors=True)
            subprocess.run(f"sync; sleep 3; find {args.input} -type f -print0 | xargs -0 cat > /dev/null", shell=True, check=True)
            started = time.perf_counter()
            proc = subprocess.run(argv_, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=args.scratch)
            if proc.returncode:
                raise SystemExit(f"{name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
            walls[name].append(time.perf_counter() - started)
            print(f"# rep {rep + 1} {name}: {walls[name][-1]:.1f} s", flush=True)
    shutil.rmtree(args.scratch, ignore_errors=True)
    base = statistics.median(walls["script"])
    print("\n| code | wall s | median | against the script |\n|---|---|---:|---:|")
    for name, values in walls.items():
        print(f"| {name} | {', '.join(f'{v:.1f}' for v in values)} | {statistics.median(values):.1f} | {base / statistics.median(values):.2f}× |")


if __name__ == "__main__":
    main()
