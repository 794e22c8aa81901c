"""`beam-etl convert` on a real local Flink against the DirectRunner and the external-worker FnApiRunner.

One cluster (`beam_etl.flink.up`, parallelism 2) serves the whole run; its SDK worker pool also
serves the FnApiRunner configuration (the embedded job service with EXTERNAL workers). Runs are
interleaved per rep. Per run:
  wall       fork to exit of `beam-etl convert`
  peak RSS   the peak of the RSS summed over every process that takes part, sampled every 0.2 s:
             the convert tree, plus for Flink the JobManager, TaskManager, job server and the
             pool with its SDK workers (JVMs included), plus for the FnApiRunner the pool
  exchange   bytes Flink's tasks read from / wrote to its data exchange (REST jobs/<id>,
             vertices[].metrics read-bytes / write-bytes), summed over the vertices

    python bench/make_photos.py /tmp/bench/photos2k --count 2000
    python bench/flink_bench.py --input /tmp/bench/photos2k --work /tmp/bench/flink
"""

import argparse
import os
import shutil
import subprocess
import sys
import threading
import time

import psutil

from beam_etl import flink, flinkrest

RUNNERS = ("direct", "fnapi", "flink")


def tree_rss(pids) -> int:
    total, seen = 0, set()
    for pid in pids:
        try:
            root = psutil.Process(pid)
            for proc in [root, *root.children(recursive=True)]:
                if proc.pid not in seen:
                    seen.add(proc.pid)
                    total += proc.memory_info().rss
        except psutil.Error:
            continue
    return total


def run_one(cmd, extra_pids, env):
    peak, done = [0], threading.Event()
    started = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], tree_rss([proc.pid, *extra_pids]))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    output = proc.communicate()[0]
    wall = time.monotonic() - started
    done.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{output[-3000:]}")
    return wall, peak[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", required=True)
    parser.add_argument("--work", required=True, help="a scratch folder: outputs and the cluster (emptied)")
    parser.add_argument("--writers", default="staged,tfrecordio")
    parser.add_argument("--runners", default=",".join(RUNNERS))
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--num_shards", default="train=4,validation=2")
    args = parser.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    images = sum(len(files) for _, _, files in os.walk(args.input))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    t0 = time.monotonic()
    cluster = flink.up(os.path.join(args.work, "cluster"), slots=2, any_ports=True)
    print(f"cluster up in {time.monotonic() - t0:.1f} s; {images} images in {args.input}", flush=True)
    cluster_pids = [cluster.pid(name) for name in flink.PROCESSES]
    pool_pid = [cluster.pid("workerpool")]
    flags = {
        "direct": ([], []),
        "fnapi": (["--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=EXTERNAL",
                   f"--environment_config=127.0.0.1:{cluster.ports['pool']}", "--direct_num_workers=2"], pool_pid),
        "flink": (cluster.flags(), cluster_pids),
    }
    rows = []
    try:
        for rep in range(args.reps):
            for writer in args.writers.split(","):
                for runner in args.runners.split(","):
                    out = os.path.join(args.work, f"{runner}-{writer}-{rep}")
                    name = f"bench-{runner}-{writer}-{rep}-{os.urandom(2).hex()}"
                    extra, pids = flags[runner]
                    cmd = [sys.executable, "-m", "beam_etl", "convert", "--input", args.input, "--output", out,
                           "--validation_fraction", "0.1", "--num_shards", args.num_shards, "--writer", writer,
                           "--progress", "none", *extra] + ([f"--job_name={name}"] if runner == "flink" else [])
                    wall, peak = run_one(cmd, pids, env)
                    exchange = None
                    if runner == "flink":
                        (job,) = flinkrest.jobs_named(cluster.rest, name)
                        exchange = flinkrest.bytes_between_tasks(cluster.rest, job["jid"])
                    rows.append((runner, writer, rep, wall, images / wall, peak, exchange))
                    shown = f", exchange read {exchange['read-bytes'] / 1e6:.1f} MB, written {exchange['write-bytes'] / 1e6:.1f} MB" if exchange else ""
                    print(f"{runner:6} {writer:10} rep {rep}: {wall:6.1f} s, {images / wall:6.1f} img/s, peak RSS {peak / 2**30:.2f} GiB{shown}", flush=True)
                    shutil.rmtree(out, ignore_errors=True)
    finally:
        flink.down(cluster.folder)
    input_mb = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(args.input) for f in fs) / 1e6
    print(f"\n{images} images, {input_mb:.0f} MB\n")
    print("| runner | writer | wall s | img/s | peak RSS GiB (tree, JVMs included) | Flink exchange read MB | written MB |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for runner, writer, rep, wall, rate, peak, exchange in rows:
        read = f"{exchange['read-bytes'] / 1e6:.1f}" if exchange else ""
        written = f"{exchange['write-bytes'] / 1e6:.1f}" if exchange else ""
        print(f"| {runner} | {writer} | {wall:.1f} | {rate:.1f} | {peak / 2**30:.2f} | {read} | {written} |")


if __name__ == "__main__":
    main()
