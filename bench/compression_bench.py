"""GZIP against no compression: conversion wall time, shard bytes, raw read rate and reader rate.

    python bench/compression_bench.py --input /tmp/photos5k [--reps 2 --num_shards 4]

Each rep converts the input twice with `beam-etl convert` (default options, --compression none
then gzip; the order alternates per rep), then, for each dataset, reads every record with a
bare TFRecordDataset (decompression and framing only) and runs the training reader
(make_dataset, decode included). Medians of interleaved reps; compare ratios, not absolutes.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def convert(inp: str, out: str, compression: str, num_shards: int) -> float:
    shutil.rmtree(out, ignore_errors=True)
    started = time.perf_counter()
    argv = ["beam-etl", "convert", "--input", inp, "--output", out, "--num_shards", str(num_shards), "--progress", "none", "--compression", compression]
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def raw_read(out: str):
    """(records/s, stored MB/s) of a bare TFRecordDataset over every shard."""
    import tensorflow as tf

    from trainer.dataset import DatasetInfo

    info = DatasetInfo.load(out)
    files = info.shard_paths("train")
    stored = sum(os.path.getsize(f) for f in files)
    ds = tf.data.TFRecordDataset(files, compression_type=info.compression, num_parallel_reads=len(files)).batch(256)
    started, records = time.perf_counter(), 0
    for batch in ds:
        records += int(batch.shape[0])
    seconds = time.perf_counter() - started
    return records / seconds, stored / seconds / 1e6, stored


def reader_rate(out: str, batches: int) -> float:
    from trainer.bench import measure
    from trainer.input import make_dataset

    ds = make_dataset(out, "train", 128, training=True, image_size=224, shuffle_buffer=1000, seed=0, prefetch_to_device=False)
    return measure("reader", ds, 3, batches).images_per_second


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--input", required=True)
    p.add_argument("--scratch", default="/tmp/compression_bench")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--num_shards", type=int, default=4)
    p.add_argument("--batches", type=int, default=20)
    args = p.parse_args(argv)
    rows = {c: {"convert_s": [], "records_per_s": [], "stored_mb_per_s": [], "reader_images_per_s": [], "bytes": 0} for c in ("none", "gzip")}
    for rep in range(args.reps):
        order = ("none", "gzip") if rep % 2 == 0 else ("gzip", "none")
        for c in order:
            out = os.path.join(args.scratch, c)
            rows[c]["convert_s"].append(convert(args.input, out, c, args.num_shards))
            rps, mbps, stored = raw_read(out)
            rows[c]["records_per_s"].append(rps)
            rows[c]["stored_mb_per_s"].append(mbps)
            rows[c]["bytes"] = stored
            rows[c]["reader_images_per_s"].append(reader_rate(out, args.batches))
            print(f"# rep {rep + 1} {c}: convert {rows[c]['convert_s'][-1]:.1f} s, raw read {rps:.0f} records/s, reader {rows[c]['reader_images_per_s'][-1]:.0f} images/s", flush=True)
    med = {c: {k: (statistics.median(v) if isinstance(v, list) else v) for k, v in r.items()} for c, r in rows.items()}
    n, g = med["none"], med["gzip"]
    print(f"\n{args.reps} interleaved reps, medians; ratio = gzip / none\n")
    print("| measure | none | gzip | gzip / none |")
    print("|---|---:|---:|---:|")
    print(f"| shard bytes (MB) | {n['bytes'] / 1e6:.1f} | {g['bytes'] / 1e6:.1f} | {g['bytes'] / n['bytes']:.3f} |")
    print(f"| convert wall time (s, whole command) | {n['convert_s']:.1f} | {g['convert_s']:.1f} | {g['convert_s'] / n['convert_s']:.2f} |")
    print(f"| raw read, TFRecordDataset (records/s) | {n['records_per_s']:.0f} | {g['records_per_s']:.0f} | {g['records_per_s'] / n['records_per_s']:.2f} |")
    print(f"| raw read (stored MB/s) | {n['stored_mb_per_s']:.0f} | {g['stored_mb_per_s']:.0f} | {g['stored_mb_per_s'] / n['stored_mb_per_s']:.2f} |")
    print(f"| training reader, decode included (images/s) | {n['reader_images_per_s']:.0f} | {g['reader_images_per_s']:.0f} | {g['reader_images_per_s'] / n['reader_images_per_s']:.2f} |")
    print(json.dumps(med))


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(HERE))
    sys.exit(main())
