"""Requests, bytes and shuffle per 1,000 images for each shard writer, writing to gs:// behind a counting proxy.

    python bench/writer_io_bench.py --count 2000 --reps 1

Photos (bench/make_photos.py, ~80 KB) from local disk to `--output gs://bkt/...` on
gcp-storage-emulator, with tests/store_proxy.py between the converter (and its SDK workers)
and the emulator, so every request the job makes to the store is counted by kind, with the
bytes of media downloads (read) and of upload bodies (written). For each writer, on the
DirectRunner and on the external-worker topology (the embedded job service, two SDK workers
from Beam's worker pool, as templates/flink runs them), one `beam-etl convert` each,
interleaved. The shuffle column is the writer's own counter (`writer_shuffle_bytes`): the
bytes it hands to a GroupByKey, printed by the convert. The emulator and the workers share
the machine's cores, so compare walls within one run only.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT]

from tests.objstore_servers import GcsServer  # noqa: E402
from tests.store_proxy import StoreProxy  # noqa: E402
from tests.worker_pool import WorkerPool  # noqa: E402

KINDS = ("media GET", "metadata GET", "list", "upload start", "upload part", "simple upload", "copy", "batch", "delete")


def shuffled_mb(stderr: str) -> float:
    found = re.search(r"shard writer sent ([\d,.]+) (MB|kB)", stderr)
    if not found:
        return 0.0
    value = float(found.group(1).replace(",", ""))
    return value if found.group(2) == "MB" else value / 1000


def convert(env, photos, out, writer, extra, flags):
    cmd = [sys.executable, "-m", "beam_etl", "convert", "--input", photos, "--output", out, "--writer", writer, *flags, *extra]
    started = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - started
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return wall, shuffled_mb(proc.stderr)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=2000)
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--writers", default="staged,tfrecordio")
    p.add_argument("--topologies", default="direct,external")
    p.add_argument("--flags", default="--validation_fraction 0.1 --num_shards train=4,validation=1")
    p.add_argument("--scratch", default="/tmp/writer_io_bench")
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args(argv)
    shutil.rmtree(args.scratch, ignore_errors=True)
    photos = os.path.join(args.scratch, "photos")
    subprocess.run([sys.executable, os.path.join(HERE, "make_photos.py"), photos, "--count", str(args.count)], check=True)
    server = GcsServer(args.scratch)
    proxy = StoreProxy(server.endpoint)
    env = dict(os.environ, **dict(server.env, STORAGE_EMULATOR_HOST=proxy.url), PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    pool = WorkerPool(os.path.join(args.scratch, "pool"), env) if "external" in args.topologies else None
    topologies = {"direct": ("DirectRunner", []), "external": ("2 external SDK workers", pool.flags(2) if pool else [])}
    rows = []
    try:
        for rep in range(args.reps):
            runs = [(t, w) for w in args.writers.split(",") for t in args.topologies.split(",")]
            for topology, writer in runs if rep % 2 == 0 else runs[::-1]:
                name, extra = topologies[topology]
                out = f"gs://bkt/bench/{topology}-{writer}-{rep}"
                proxy.reset()
                wall, shuffle = convert(env, photos, out, writer, extra, args.flags.split())
                counted = proxy.snapshot()
                document = json.loads(server.read(out + "/dataset.json"))
                shards = sum(s["bytes"] for s in document["splits"].values())
                rows.append({"topology": name, "writer": writer, "rep": rep, "wall_s": wall, "shuffle_mb": shuffle,
                             "shard_mb": shards / 1e6, **counted})
                print(json.dumps(rows[-1]), flush=True)
    finally:
        if pool:
            pool.close()
        proxy.close()
        server.close()
        shutil.rmtree(args.scratch, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    per = 1000 / args.count
    print(f"\nper 1,000 images ({args.count} photos, {rows[0]['shard_mb']:.0f} MB of shards; {args.flags}):\n")
    print("| topology | writer | wall s | requests | " + " | ".join(KINDS) + " | MB read | MB written | read / shards | shuffle MB |")
    print("| --- | --- | ---: | ---: | " + " | ".join("---:" for _ in KINDS) + " | ---: | ---: | ---: | ---: |")
    for r in rows:
        kinds = " | ".join(f"{r['by_kind'].get(k, 0) * per:,.0f}" for k in KINDS)
        print(f"| {r['topology']} | {r['writer']} | {r['wall_s']:.1f} | {r['requests'] * per:,.0f} | {kinds} | "
              f"{r['bytes_read'] / 1e6 * per:,.1f} | {r['bytes_written'] / 1e6 * per:,.1f} | "
              f"{r['bytes_read'] / (r['shard_mb'] * 1e6):.2f}× | {r['shuffle_mb'] * per:,.2f} |")


if __name__ == "__main__":
    main()
