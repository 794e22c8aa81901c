"""The whole per-image function on one core: scaled JPEG validation against the full decode.

    python bench/make_photos.py /tmp/photos1k --count 1000
    python bench/validate_bench.py --input /tmp/photos1k --reps 5

Per image: read the file, check the label, validate and canonicalise (images.canonicalise),
statistics, sha256, and the tf.train.Example bytes: records.make_record, as the encode pool
runs it. Each measurement in a fresh process on one core; the variants alternate rep by rep;
medians of images/s. The third variant sets glibc's malloc as the encode pool's processes do
(workpool.tune_malloc).
"""

import argparse
import glob
import os
import statistics
import subprocess
import sys
import time

sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

from beam_etl import images, records, workpool  # noqa: E402
from beam_etl.sources import ImageRef  # noqa: E402


def rate(paths, policy, label_ids, scaled: bool) -> float:
    started = time.process_time()
    for path in paths:
        label = os.path.basename(os.path.dirname(path))
        ref = ImageRef(uri=path, key=os.path.relpath(path), label=label, split="train", size=0)
        with open(path, "rb") as f:
            data = f.read()
        records.make_record(ref, data, policy, label_ids, "default", scaled=scaled)
    return len(paths) / (time.process_time() - started)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--input", required=True, help="a folder of ROOT/<label>/*.jpg (bench/make_photos.py)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--one", default="", help=argparse.SUPPRESS)  # "scaled,tuned": one run, in a child
    args = p.parse_args(argv)
    paths = sorted(glob.glob(os.path.join(args.input, "*", "*.jpg")))
    label_ids = {name: i for i, name in enumerate(sorted({os.path.basename(os.path.dirname(x)) for x in paths}))}
    policy = images.Policy()
    if args.one:  # one measurement in this fresh process: tune_malloc can't be undone
        scaled, tuned = args.one.split(",")
        if tuned == "1":
            workpool.tune_malloc()
        print(rate(paths, policy, label_ids, scaled=scaled == "1"))
        return
    variants = {"full decode": "0,0", "scaled decode (1/8)": "1,0", "scaled decode, malloc as the pool sets it": "1,1"}
    results = {name: [] for name in variants}
    for rep in range(args.reps):
        for name in (list(results) if rep % 2 == 0 else list(results)[::-1]):
            out = subprocess.run([sys.executable, __file__, "--input", args.input, "--one", variants[name]],
                                 capture_output=True, text=True, check=True).stdout
            results[name].append(float(out.split()[-1]))
            print(f"# rep {rep + 1} {name:42} {results[name][-1]:7.1f} images/s of CPU", flush=True)
    base = statistics.median(results["full decode"])
    print(f"\n{len(paths)} photos, {args.reps} alternating reps, one core, CPU time, medians\n")
    print("| per-image function | images/s per core | ratio |")
    print("|---|---:|---:|")
    for name, runs in results.items():
        print(f"| {name} | {statistics.median(runs):.0f} | {statistics.median(runs) / base:.2f}× |")


if __name__ == "__main__":
    main()
