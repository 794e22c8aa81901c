"""The plain-Python converter the Beam pipeline is measured against (issue 6).

It does the same per-image work as `beam-etl convert` -- list the inputs with
beam_etl.sources, read and encode each file with records.convert_or_reject (the
pipeline's own per-image function, but with the full decode a plain script does, unless
--scaled_decode), frame it with tfrecord.frame -- and writes the same number of
TFRecord shards per split, plus the dataset counts. No Beam pipeline, no TFT analysis,
no duplicate/leakage detection, no shuffle within shards, no atomic publish: it is the
floor that the pipeline's overhead is measured from.

    python bench/baseline.py --input /tmp/photos5k --output /tmp/base --num_shards 8            # Pool(cores)
    python bench/baseline.py --input /tmp/photos5k --output /tmp/base --num_shards 8 --workers 1  # one process

Workers return ((split, example bytes, facts), None) or (None, reject); the parent writes each split's records
round-robin to its shards (record i of a split goes to shard i % count), so memory stays
flat: at most the pool's in-flight results are held.
"""

import argparse
import json
import multiprocessing
import os
import sys
import time

from beam_etl import images, records, sharding, sources, tfrecord

_STATE = {}


def _init(settings):
    _STATE["settings"] = settings


def convert_one(ref):
    """The pipeline's own per-image function: ((split, example bytes, facts), None) or (None, (reason, message))."""
    return records.convert_or_reject(ref, _STATE["settings"])


class ShardWriter:
    """Round-robin writer: one open file per (split, shard); named -of-COUNT at the end."""

    def __init__(self, output: str, num_shards: int):
        self.output, self.num_shards = output, num_shards
        self.files, self.counts = {}, {}

    def write(self, split: str, example: bytes) -> None:
        i = self.counts.get(split, 0)
        self.counts[split] = i + 1
        key = (split, i % self.num_shards)
        f = self.files.get(key)
        if f is None:
            f = self.files[key] = open(os.path.join(self.output, f".tmp-{split}-{key[1]:05d}"), "wb")
        f.write(tfrecord.frame(example))

    def close(self) -> dict:
        """{split: [shard names]}; a split with fewer records than shards gets one shard per record."""
        shards = {}
        for (split, i), f in sorted(self.files.items()):
            f.close()
            count = min(self.num_shards, self.counts[split])
            name = sharding.shard_name(split, i, count)
            os.replace(f.name, os.path.join(self.output, name))
            shards.setdefault(split, []).append(name)
        return shards


def run(inputs, output, num_shards, policy, workers, schema_name="default", val_frac=0.0, test_frac=0.0, max_file_mb=64.0, chunksize=16, scaled=False):
    """Convert; returns the summary dict it also writes to OUTPUT/counts.json."""
    started = time.perf_counter()
    os.makedirs(output, exist_ok=True)
    label_names = sources.label_names(inputs)
    label_ids = {name: i for i, name in enumerate(label_names)}
    refs = [ref for uri in inputs for ref, _ in sources.listing(uri)]
    init_args = (records.Settings(policy, label_ids, schema_name, val_frac, test_frac, int(max_file_mb * 1e6), scaled_decode=scaled),)
    writer = ShardWriter(output, num_shards)
    label_counts, reject_counts, channel_sum = {}, {}, None
    first_record_s = None

    def consume(results):
        nonlocal channel_sum, first_record_s
        for record, reject in results:
            if reject is not None:
                reject_counts[reject[0]] = reject_counts.get(reject[0], 0) + 1
                continue
            split, example, facts = record
            writer.write(split, example)
            if first_record_s is None:
                first_record_s = time.perf_counter() - started
            key = f"{split}/{facts.label_text}"
            label_counts[key] = label_counts.get(key, 0) + 1
            m = facts.pixel_mean
            channel_sum = list(m) if channel_sum is None else [a + b for a, b in zip(channel_sum, m)]

    if workers <= 1:
        _init(*init_args)
        consume(map(convert_one, refs))
    else:
        with multiprocessing.get_context("fork").Pool(workers, initializer=_init, initargs=init_args) as pool:
            consume(pool.imap_unordered(convert_one, refs, chunksize=chunksize))
    shards = writer.close()
    examples = sum(writer.counts.values())
    summary = {
        "inputs": len(refs),
        "examples": examples,
        "splits": writer.counts,
        "shards": shards,
        "label_counts": label_counts,
        "reject_counts": reject_counts,
        "channel_mean": [c / examples for c in channel_sum] if channel_sum else None,
        "workers": workers,
        "first_record_s": first_record_s,
        "seconds": time.perf_counter() - started,
    }
    with open(os.path.join(output, "counts.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return summary


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--input", action="append", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--num_shards", type=int, default=8)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="1: one process; N: multiprocessing.Pool(N) (default: cores)")
    p.add_argument("--channels", type=int, choices=(1, 3), default=3)
    p.add_argument("--image_format", choices=("jpeg", "png"), default="jpeg")
    p.add_argument("--jpeg_quality", type=int, default=95)
    p.add_argument("--max_side", type=int, default=0)
    p.add_argument("--validation_fraction", type=float, default=0.0)
    p.add_argument("--test_fraction", type=float, default=0.0)
    p.add_argument("--schema", choices=("default", "imagenet"), default="default")
    p.add_argument("--chunksize", type=int, default=16)
    p.add_argument("--scaled_decode", action="store_true",
                   help="validate pass-through JPEGs at 1/8 scale as beam-etl does (default: the full decode a plain script does)")
    args = p.parse_args(argv)
    policy = images.Policy(channels=args.channels, image_format=args.image_format, jpeg_quality=args.jpeg_quality, max_side=args.max_side)
    summary = run(args.input, args.output, args.num_shards, policy, args.workers, args.schema, args.validation_fraction, args.test_fraction, chunksize=args.chunksize,
                  scaled=args.scaled_decode)
    print(json.dumps({k: summary[k] for k in ("inputs", "examples", "splits", "reject_counts", "workers", "first_record_s", "seconds")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
