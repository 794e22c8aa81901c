"""Bombs, crashes and killed pool processes against a clean run: wall time and peak RSS of the whole tree.

    python bench/limits_bench.py --work /tmp/limits --good 5000 --reps 1

Builds GOOD photos (bench/make_photos.py's kind is not needed: small test photos) plus the four
inputs of tests/bombs.py: a progressive time bomb (1 MB, ~17 s of stock decode), a memory bomb
(a 1.4 MB PNG whose work peaks at 1.3 GB), and two files that tests/crash_plugin decodes by
SIGKILL and SIGSEGV of their own process. Then, interleaved per rep:

  clean        the good photos only, in the pool
  hostile      the same plus the four bad inputs, in the pool
  kill-encode  hostile, with one pool process SIGKILLed from outside once the first chunk is staged
  kill-write   hostile, with the pool process that writes a shard SIGKILLed (tests/slow_shards holds
               each shard open 2 s longer, so this row's wall includes 2 s per shard and process)
  clean-0      the good photos and the two bombs' folders without them, --encode_processes 0
  bombs-0      the good photos plus the time and memory bombs, --encode_processes 0

Each run: --image_timeout 2 --image_memory_mb 1024. Reported: wall, the peak of the RSS summed
over the process tree (psutil, every 0.1 s), rejects by reason, and the processes lost.
"""

import argparse
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "bench")]

from convert_bench import tree_rss  # noqa: E402
from tests import bombs  # noqa: E402
from tests.corpus import encode, photo  # noqa: E402
from tests.test_limits import _mid_encode, _mid_write  # noqa: E402

LIMITS = ["--image_timeout", "2", "--image_memory_mb", "1024", "--progress", "none", "--num_shards", "3"]


def build(folder, good, bad):
    for i in range(good):
        label = ("ant", "bee", "cow")[i % 3]
        path = os.path.join(folder, label, f"img_{i}.png" if i % 4 == 0 else f"img_{i}.jpg")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(encode(photo(64 + i % 32, 48, seed=i), "PNG" if i % 4 == 0 else "JPEG"))
    for rel, data in bad.items():
        with open(os.path.join(folder, rel), "wb") as f:
            f.write(data)


def run(folder, out, extra, condition=None, env=None):
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "tests", "crash_plugin") + os.pathsep + ROOT, BEAM_ETL_TEST_CRASH_PLUGIN="1",
               TF_CPP_MIN_LOG_LEVEL="2", **(env or {}))
    started = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "beam_etl", "convert", "--input", folder, "--output", out, *LIMITS, *extra],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)
    ps, peak, killed = psutil.Process(child.pid), 0, None
    while child.poll() is None:
        peak = max(peak, tree_rss(ps))
        if condition and killed is None:
            victims = condition(pathlib.Path(out), child.pid)
            if victims:
                killed = victims[0]
                os.kill(killed, signal.SIGKILL)
        time.sleep(0.1)
    wall = time.perf_counter() - started
    text = child.stdout.read()
    if child.returncode != 0:
        raise SystemExit(f"convert failed:\n{text[-3000:]}")
    document = json.load(open(os.path.join(out, "dataset.json")))
    lost = next((line.split()[1] for line in text.splitlines() if "encode-pool process" in line), "0")
    return {"wall": wall, "peak_mb": peak / 2**20, "written": sum(s["examples"] for s in document["splits"].values()),
            "rejects": document["rejected"]["by_reason"], "lost": lost, "killed": killed}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", required=True)
    ap.add_argument("--good", type=int, default=5000)
    ap.add_argument("--reps", type=int, default=1)
    args = ap.parse_args(argv)
    bad = {"ant/zz_time_bomb.jpg": bombs.progressive_time_bomb(), "bee/zz_memory_bomb.png": bombs.memory_bomb(),
           "cow/zz_crash_kill.png": bombs.crash_file("SIGKILL"), "cow/zz_crash_segv.png": bombs.crash_file("SIGSEGV")}
    folders = {"clean": os.path.join(args.work, "clean"), "hostile": os.path.join(args.work, "hostile"), "bombs": os.path.join(args.work, "bombs")}
    build(folders["clean"], args.good, {})
    build(folders["hostile"], args.good, bad)
    build(folders["bombs"], args.good, {k: v for k, v in bad.items() if "crash" not in k})
    out = os.path.join(args.work, "out")
    rows = {
        "clean": (folders["clean"], ["--encode_processes", "2"], None, None),
        "hostile": (folders["hostile"], ["--encode_processes", "2"], None, None),
        "kill-encode": (folders["hostile"], ["--encode_processes", "2"], _mid_encode, None),
        "kill-write": (folders["hostile"], ["--encode_processes", "2"], _mid_write, {"BEAM_ETL_TEST_SHARD_PAUSE": "2"}),
        "clean-0": (folders["clean"], ["--encode_processes", "0"], None, None),
        "bombs-0": (folders["bombs"], ["--encode_processes", "0"], None, None),
    }
    print("| run | rep | wall | peak RSS, tree | written | rejects | processes lost |\n|---|---:|---:|---:|---:|---|---:|")
    for rep in range(args.reps):
        for name, (folder, extra, condition, env) in rows.items():
            r = run(folder, out, extra, condition, env)
            rejects = ", ".join(f"{k} {v}" for k, v in sorted(r["rejects"].items())) or "none"
            print(f"| {name} | {rep + 1} | {r['wall']:.1f} s | {r['peak_mb']:,.0f} MB | {r['written']:,} | {rejects} | {r['lost']} |", flush=True)
    shutil.rmtree(args.work, ignore_errors=True)


if __name__ == "__main__":
    main()
