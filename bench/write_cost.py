"""What writing a new file costs: buffered writes against O_DIRECT (beam_etl.localio), CPU and wall.

    python bench/write_cost.py --dir /tmp --mb 1600 --reps 2

Writes the same framed records (80 KB each, the size of a photo) to fresh files, alternately
buffered and with localio.DirectWriter, and reports wall, user and system seconds per GB.
The files are kept until the end, so that no run reuses pages another one freed.
"""

import argparse
import os
import shutil
import sys
import tempfile
import time

from beam_etl import localio, tfrecord


def buffered(path, records, repeat):
    with open(path, "wb") as f:
        for _ in range(repeat):
            for record in records:
                f.write(record)


def direct(path, records, repeat):
    with localio.DirectWriter(path) as out:
        for _ in range(repeat):
            for record in records:
                out.write(record)
    return out.direct


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", default=tempfile.gettempdir(), help="a folder on the filesystem to measure")
    p.add_argument("--mb", type=int, default=1600, help="MB per file")
    p.add_argument("--reps", type=int, default=2)
    args = p.parse_args(argv)
    records = [tfrecord.frame(os.urandom(80_000)) for _ in range(100)]
    repeat = max(1, args.mb * 1_000_000 // sum(map(len, records)))
    folder = tempfile.mkdtemp(prefix="write_cost-", dir=args.dir)
    results = {}
    try:
        for rep in range(args.reps):
            for name, fn in (("buffered", buffered), ("O_DIRECT", direct))[:: 1 if rep % 2 == 0 else -1]:
                path = os.path.join(folder, f"{name}-{rep}.bin")
                t0, c0 = time.perf_counter(), os.times()
                took_direct = fn(path, records, repeat)
                c1, wall = os.times(), time.perf_counter() - t0
                gb = os.path.getsize(path) / 1e9
                if name == "O_DIRECT" and not took_direct:
                    name = "O_DIRECT refused: plain"
                results.setdefault(name, []).append((wall / gb, (c1.user - c0.user) / gb, (c1.system - c0.system) / gb))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"\n{args.mb} MB per file in {args.dir}, {args.reps} reps, best of each; seconds per GB\n")
    print("| write | wall s/GB | user s/GB | system s/GB |")
    print("|---|---:|---:|---:|")
    for name, runs in results.items():
        wall, user, system = min(runs)
        print(f"| {name} | {wall:.2f} | {user:.2f} | {system:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
