"""The whole per-image function on one core: scaled JPEG validation against the full decode.

    python bench/make_photos.py /tmp/photos1k --count 1000
    python bench/validate_bench.py --input /tmp/photos1k --reps 5

Per image: read the file, check the label, validate and canonicalise (images.canonicalise),
statistics, sha256, and the tf.train.Example bytes: records.make_record, as the encode pool
runs it. One process, one core; the two variants alternate rep by rep; medians of images/s.
"""

import argparse
import glob
import os
import statistics
import sys
import time

sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

from beam_etl import images, records  # noqa: E402
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
    args = p.parse_args(argv)
    paths = sorted(glob.glob(os.path.join(args.input, "*", "*.jpg")))
    label_ids = {name: i for i, name in enumerate(sorted({os.path.basename(os.path.dirname(x)) for x in paths}))}
    policy = images.Policy()
    results = {"full decode": [], "scaled decode (1/8)": []}
    for rep in range(args.reps):
        for name in (list(results) if rep % 2 == 0 else list(results)[::-1]):
            results[name].append(rate(paths, policy, label_ids, scaled=name.startswith("scaled")))
            print(f"# rep {rep + 1} {name:22} {results[name][-1]:7.1f} images/s of CPU", flush=True)
    base = statistics.median(results["full decode"])
    print(f"\n{len(paths)} photos, {args.reps} alternating reps, one core, CPU time, medians\n")
    print("| per-image function | images/s per core | ratio |")
    print("|---|---:|---:|")
    for name, runs in results.items():
        print(f"| {name} | {statistics.median(runs):.0f} | {statistics.median(runs) / base:.2f}× |")


if __name__ == "__main__":
    main()
