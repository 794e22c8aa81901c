"""Beam alone: does a DirectRunner mode lose elements on their way into a GroupByKey?

    python bench/beam_record_loss.py --mode multi_threading --size 80000 --reps 3

Creates N numbered elements of SIZE bytes each after a Reshuffle, groups them by key and counts
the distinct numbers that come out, per run. No beam_etl code is involved. With Beam 2.77 on
2 cores, multi_threading (2 workers) lost 4 to 20 of 5,000 80 KB elements in 3 of 7 runs; 1 KB
elements, in_memory and multi_processing lost none. That is why `beam-etl convert` refuses
`--writer tfrecordio` (whose WriteToTFRecord groups the payloads) in multi_threading mode.
"""

import argparse
import os
import shutil
import struct
import sys
import tempfile

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions


def run_once(count: int, size: int, mode: str, workers: int) -> int:
    """The number of distinct elements that came out of the GroupByKey."""
    folder = tempfile.mkdtemp(prefix="beam_record_loss-")
    path = os.path.join(folder, "count")
    workers = 1 if mode == "in_memory" else workers  # in_memory has one worker
    options = PipelineOptions(["--direct_running_mode", mode, "--direct_num_workers", str(workers)])
    with beam.Pipeline(options=options) as p:
        _ = (
            p
            | "Numbers" >> beam.Create(range(count))
            | "Shuffle" >> beam.Reshuffle()
            | "Payload" >> beam.Map(lambda i: (i % 8, struct.pack("<I", i) + bytes(size)))
            # (key, 4-byte number + SIZE zero bytes)
            | "Group" >> beam.GroupByKey()
            | "Numbers out" >> beam.FlatMap(lambda kv: [struct.unpack("<I", v[:4])[0] for v in kv[1]])
            | "Distinct" >> beam.Distinct()
            | "Count" >> beam.combiners.Count.Globally()
            | "Keep" >> beam.Map(_write, path)
        )
    try:
        with open(path) as f:
            return int(f.read())
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _write(n: int, path: str) -> None:
    with open(path, "w") as f:
        f.write(str(n))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", default="multi_threading", choices=("in_memory", "multi_threading", "multi_processing"))
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--count", type=int, default=5000)
    p.add_argument("--size", type=int, default=80_000, help="bytes per element")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args(argv)
    lost_runs = 0
    for rep in range(args.reps):
        out = run_once(args.count, args.size, args.mode, args.workers)
        lost_runs += out != args.count
        print(f"run {rep + 1}: {out} of {args.count} elements came out of the GroupByKey ({args.mode} x{args.workers}, {args.size} bytes each)", flush=True)
    print(f"{lost_runs} of {args.reps} runs lost elements")
    return 0


if __name__ == "__main__":
    sys.exit(main())
