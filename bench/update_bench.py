"""A 1% change to a dataset: `convert --update` against the full conversion, whole process (issue 33).

    python bench/update_bench.py --photos /tmp/photos50k --work /tmp/upd --reps 2

Each rep, with a manifest over every photo under --photos (label: its folder):
1. a full conversion (`beam-etl convert`), timed;
2. a change of 1% of the inputs, a quarter each: new files, other bytes in existing files,
   relabelled rows and removed rows;
3. `beam-etl convert --update`, timed, with the line it prints;
4. `beam-etl convert --update` again, with no change, timed;
5. `beam-etl compact` with --max_excluded_fraction 0.005, so that both generations are
   rewritten (the 1% change dropped 0.75% of version 1's records): every record copied once;
6. `beam-etl gc --keep 1`, timed, and the dataset folder's bytes before and after.
The changed files are copies under WORK, so --photos is never modified; WORK is removed at the end.
"""

import argparse
import os
import random
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from bench.make_photos import photo  # noqa: E402


def timed(cmd, prefix: str = "beam-etl: ") -> tuple:
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[:4]} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    lines = [line for line in proc.stdout.splitlines() if line.startswith(prefix)]
    return time.perf_counter() - started, lines[0] if lines else ""


def write_manifest(path: str, rows) -> None:
    with open(path, "w") as f:
        f.write("path,label\n" + "".join(f"{p},{label}\n" for p, label in rows))


def one_rep(photos: str, work: str, fraction: float, rep: int) -> dict:
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.join(work, "copies"))
    rows = sorted([os.path.join(root, name), os.path.basename(root)] for root, _, names in os.walk(photos) for name in names if name.endswith(".jpg"))
    rng = random.Random(rep)
    quarter = max(1, int(len(rows) * fraction / 4))
    picked = rng.sample(range(len(rows)), 3 * quarter)
    changed, relabelled, removed = picked[:quarter], picked[quarter:2 * quarter], picked[2 * quarter:]
    for i in changed:  # a copy the change may overwrite
        copy = os.path.join(work, "copies", f"{i}.jpg")
        shutil.copyfile(rows[i][0], copy)
        rows[i][0] = copy
    labels = sorted({label for _, label in rows})
    manifest, out = os.path.join(work, "m.csv"), os.path.join(work, "ds")
    write_manifest(manifest, rows)
    full_s, _ = timed(["beam-etl", "convert", "--input", manifest, "--output", out, "--progress", "none"])
    for n, i in enumerate(changed):
        with open(rows[i][0], "wb") as f:
            f.write(photo(10_000_000 + n))
    for i in relabelled:
        rows[i][1] = labels[(labels.index(rows[i][1]) + 1) % len(labels)]
    gone = set(removed)
    rows = [row for i, row in enumerate(rows) if i not in gone]
    for n in range(quarter):
        path = os.path.join(work, "copies", f"new-{n}.jpg")
        with open(path, "wb") as f:
            f.write(photo(20_000_000 + n))
        rows.append([path, labels[n % len(labels)]])
    write_manifest(manifest, rows)
    update_s, update_line = timed(["beam-etl", "convert", "--update", "--input", manifest, "--output", out, "--progress", "none"])
    again_s, again_line = timed(["beam-etl", "convert", "--update", "--input", manifest, "--output", out, "--progress", "none"])
    compact_s, compact_line = timed(["beam-etl", "compact", out, "--max_excluded_fraction", "0.005"], prefix=out)
    before = folder_bytes(out)
    gc_s, gc_line = timed(["beam-etl", "gc", out, "--keep", "1"], prefix=out)
    after = folder_bytes(out)
    shutil.rmtree(work, ignore_errors=True)
    return {"full": full_s, "update": update_s, "again": again_s, "update_line": update_line, "again_line": again_line, "changed": 4 * quarter,
            "compact": compact_s, "compact_line": compact_line, "gc": gc_s, "gc_line": gc_line, "before_gc": before, "after_gc": after}


def folder_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(folder) for name in names)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--photos", required=True, help="a folder of class folders of JPEGs (bench/make_photos.py)")
    p.add_argument("--work", required=True, help="a scratch folder, removed at the end")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--fraction", type=float, default=0.01, help="the share of inputs changed")
    args = p.parse_args(argv)
    results = []
    for rep in range(args.reps):
        r = one_rep(args.photos, args.work, args.fraction, rep)
        results.append(r)
        print(f"# rep {rep + 1}: full {r['full']:.1f} s, update {r['update']:.1f} s ({r['update'] / r['full']:.1%}), no change {r['again']:.1f} s "
              f"({r['again'] / r['full']:.1%}), compact {r['compact']:.1f} s, gc {r['gc']:.1f} s\n#   {r['update_line']}\n#   {r['again_line']}\n#   {r['compact_line']}\n#   {r['gc_line']}", flush=True)
    print("\n| rep | inputs changed | full conversion s | --update s | share | no-change --update s | share | compact (all) s | share | gc --keep 1 s | MB before / after gc |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for i, r in enumerate(results, 1):
        print(f"| {i} | {r['changed']:,} | {r['full']:.1f} | {r['update']:.1f} | {r['update'] / r['full']:.1%} | {r['again']:.1f} | {r['again'] / r['full']:.1%} "
              f"| {r['compact']:.1f} | {r['compact'] / r['full']:.1%} | {r['gc']:.1f} | {r['before_gc'] / 1e6:,.0f} / {r['after_gc'] / 1e6:,.0f} |")


if __name__ == "__main__":
    main()
