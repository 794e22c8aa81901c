"""Whole-process wall time, start-up time and peak memory of `beam-etl convert` against bench/baseline.py.

Every configuration runs as its own subprocess, interleaved (rep 1: A B C ..., rep 2: A B C ...)
so that a busy neighbour on a shared machine slows all of them alike; compare the ratios,
not the absolute figures.

    python bench/convert_bench.py --input /tmp/photos5k --reps 2 --modes passthrough,reencode

Measured per run:
  wall      fork to exit of the whole command (imports, graph building, everything)
  startup   fork until the first record is on disk: the first chunk file in
            OUT/.staging-*/chunks for beam-etl (staged writer), the first shard file for the
            baseline; polled every 20 ms
  maxrss    the largest peak RSS of any one process of the tree (os.wait4 rusage, as /usr/bin/time -f %M)
  sum RSS   the peak of the RSS summed over the process tree, sampled every 0.2 s with psutil
            (what matters in multi_processing mode, where the work is in child processes)

--cache sets the page cache before every run, the same for every configuration: `warm` reads
every input once (inputs on a warm local disk), `cold` writes back and drops the whole page
cache (inputs read from the disk; needs root). Left as it is, a run finds whatever the run
before it left cached, and on a 2-core VM that moved a 50k run from 100 s to 168 s.
"""

import argparse
import glob
import os
import shutil
import statistics
import subprocess
import sys
import time

import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
CORES = os.cpu_count() or 1


def configs(names):
    """{name: (argv builder, first-record glob builder)}."""
    beam = lambda extra: (lambda inp, out, mode_args, shards: ["beam-etl", "convert", "--input", inp, "--output", out, "--num_shards", str(shards), "--progress", "none", *extra, *mode_args])
    base = lambda workers: (lambda inp, out, mode_args, shards: [sys.executable, os.path.join(HERE, "baseline.py"), "--input", inp, "--output", out, "--num_shards", str(shards), "--workers", str(workers), *mode_args])
    beam_first = lambda out: os.path.join(out, ".staging-*", "chunks", "*")
    base_first = lambda out: os.path.join(out, ".tmp-*")
    no_pool = ["--encode_processes", "0"]
    table = {
        # default: no flags at all, i.e. in_memory x1 with an encode pool of every core
        f"beam default (in_memory x1 + {CORES} encode processes)": (beam([]), beam_first),
        "beam in_memory x1": (beam(["--writer", "staged", "--direct_running_mode", "in_memory", "--direct_num_workers", "1", *no_pool]), beam_first),
        f"beam multi_threading x{CORES}": (beam(["--writer", "staged", "--direct_running_mode", "multi_threading", "--direct_num_workers", str(CORES), *no_pool]), beam_first),
        f"beam multi_processing x{CORES}": (beam(["--writer", "staged", "--direct_running_mode", "multi_processing", "--direct_num_workers", str(CORES), *no_pool]), beam_first),
        # not multi_threading: beam-etl refuses tfrecordio there (bench/beam_record_loss.py)
        "beam tfrecordio in_memory x1": (beam(["--writer", "tfrecordio", "--direct_running_mode", "in_memory", *no_pool]), None),
        "baseline single process": (base(1), base_first),
        f"baseline Pool({CORES})": (base(CORES), base_first),
    }
    aliases = {"default": f"beam default (in_memory x1 + {CORES} encode processes)", "in_memory": "beam in_memory x1", "multi_threading": f"beam multi_threading x{CORES}", "multi_processing": f"beam multi_processing x{CORES}",
               "tfrecordio": "beam tfrecordio in_memory x1", "single": "baseline single process", "pool": f"baseline Pool({CORES})"}
    return {aliases.get(n, n): table[aliases.get(n, n)] for n in names}


MODES = {"passthrough": [], "reencode": ["--max_side", "300"]}


def tree_rss(proc: psutil.Process) -> int:
    total = 0
    try:
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def run_once(argv, first_glob, out, env=None):
    """One run into `out`, which the caller has emptied; env: the child's environment (default: ours)."""
    started = time.perf_counter()
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    ps = psutil.Process(child.pid)
    first, peak_sum, next_sample = None, 0, 0.0
    while True:
        pid, status, usage = os.wait4(child.pid, os.WNOHANG)
        now = time.perf_counter() - started
        if pid:
            break
        if first is None and first_glob and glob.glob(first_glob):
            first = now
        if now >= next_sample:
            peak_sum = max(peak_sum, tree_rss(ps))
            next_sample = now + 0.2
        time.sleep(0.02)
    wall = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    err = child.stderr.read().decode(errors="replace")
    if child.returncode:
        raise RuntimeError(f"{' '.join(argv)} exited {child.returncode}:\n{err[-3000:]}")
    return {"wall": wall, "startup": first, "maxrss_mb": usage.ru_maxrss / 1024, "sum_rss_mb": peak_sum / 2**20}


def set_cache(state: str, folder: str) -> None:
    """Put the page cache in `state` (warm, cold or asis) before a run."""
    if state == "warm":
        for root, _, files in os.walk(folder):
            for name in files:
                with open(os.path.join(root, name), "rb") as f:
                    while f.read(1 << 20):
                        pass
    elif state == "cold":
        os.sync()
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
        except OSError as e:
            raise SystemExit(f"--cache cold: cannot drop the page cache ({e}); run as root, or pass --cache warm") from None


def count_images(folder):
    return sum(1 for _, _, files in os.walk(folder) for f in files if f.lower().endswith((".jpg", ".jpeg", ".png")))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--input", required=True)
    p.add_argument("--scratch", default="/tmp/convert_bench")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--num_shards", type=int, default=8)
    p.add_argument("--modes", default="passthrough,reencode")
    p.add_argument("--configs", default="default,in_memory,multi_threading,multi_processing,single,pool")
    p.add_argument("--ratio_to", default="pool", help="the config the ratio column divides by")
    p.add_argument("--cache", choices=("warm", "cold", "asis"), default="warm", help="page cache before every run: inputs read once (warm), everything dropped (cold, needs root), or as the last run left it")
    args = p.parse_args(argv)
    table = configs(args.configs.split(","))
    ratio_to = configs([args.ratio_to]).popitem()[0] if args.ratio_to else None
    images = count_images(args.input)
    results = {}  # (mode, name) -> [run dicts]
    for rep in range(args.reps):
        for mode in args.modes.split(","):
            names = list(table) if rep % 2 == 0 else list(table)[::-1]  # alternate the order too
            for name in names:
                build, first = table[name]
                out = os.path.join(args.scratch, "out")
                shutil.rmtree(out, ignore_errors=True)  # before the cache is set, so that every run finds the same
                set_cache(args.cache, args.input)
                r = run_once(build(args.input, out, MODES[mode], args.num_shards), first(out) if first else None, out)
                results.setdefault((mode, name), []).append(r)
                print(f"# rep {rep + 1} {mode:11} {name:36} wall {r['wall']:6.1f}s startup {r['startup'] if r['startup'] is None else round(r['startup'], 1)}s "
                      f"maxrss {r['maxrss_mb']:6.0f} MB sum {r['sum_rss_mb']:6.0f} MB", flush=True)
    shutil.rmtree(args.scratch, ignore_errors=True)
    print(f"\n{images} images, {args.reps} interleaved reps, {CORES} cores, page cache {args.cache}; medians; ratio = throughput / {ratio_to}\n")
    print("| mode | configuration | wall s | images/s | ratio | start-up s | peak RSS one process MB | peak RSS tree sum MB |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for mode in args.modes.split(","):
        ref = statistics.median(r["wall"] for r in results[(mode, ratio_to)]) if (mode, ratio_to) in results else None
        for name in table:
            runs = results[(mode, name)]
            wall = statistics.median(r["wall"] for r in runs)
            starts = [r["startup"] for r in runs if r["startup"] is not None]
            start = f"{statistics.median(starts):.1f}" if starts else "n/a"
            ratio = f"{ref / wall:.2f}x" if ref else "n/a"
            print(f"| {mode} | {name} | {wall:.1f} | {images / wall:.0f} | {ratio} | {start} | "
                  f"{max(r['maxrss_mb'] for r in runs):.0f} | {max(r['sum_rss_mb'] for r in runs):.0f} |")


if __name__ == "__main__":
    sys.exit(main())
