"""Conversion rate from gs:// with an emulated per-request latency, against the same photos on local disk.

    python bench/objstore_bench.py --count 2000 --delays 0,20 --shim_ms 20 --reps 1 --modes passthrough

Starts gcp-storage-emulator (tests/objstore_servers.py), uploads the photos into it, and puts
the proxy of tests/store_proxy.py in front of it, which holds every request each row's delay
(--delays) before passing it on; Beam's GCS client talks to the proxy (STORAGE_EMULATOR_HOST).
The shim rows read local disk with bench/latency_shim.c preloaded, which sleeps --shim_ms in
every open() of a photo (network storage that costs per file). Each configuration is a
whole `beam-etl convert` in its own process, interleaved as in convert_bench.py, output on
local disk, so only the input side differs. The emulator runs on the same cores as the
converter; its CPU per request is part of the gs:// figures.

  wall       fork to exit of the whole command
  encode s   wall minus start-up (fork until the first chunk of records is on disk): the
             part of the run that reads and decodes, which the latency hits
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]

import convert_bench  # noqa: E402
from latency_proxy import LatencyProxy  # noqa: E402

from tests.objstore_servers import GcsServer  # noqa: E402

MODES = convert_bench.MODES


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=3000, help="photos (bench/make_photos.py)")
    p.add_argument("--delays", default="0,20", help="ms added to every gs:// request, one set of rows each")
    p.add_argument("--shim_ms", type=float, default=20.0, help="rows with bench/latency_shim.c adding this to every open() of a photo on local disk; 0: none")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--modes", default="passthrough,reencode")
    p.add_argument("--reads", default="16,1", help="--reads_in_flight values to run from gs://")
    p.add_argument("--num_shards", type=int, default=4)
    p.add_argument("--scratch", default="/tmp/objstore_bench")
    args = p.parse_args(argv)
    shutil.rmtree(args.scratch, ignore_errors=True)
    photos = os.path.join(args.scratch, "photos")
    subprocess.run([sys.executable, os.path.join(HERE, "make_photos.py"), photos, "--count", str(args.count)], check=True)
    images = convert_bench.count_images(photos)
    server = GcsServer(args.scratch)
    proxy = LatencyProxy(server.endpoint, 0)
    shim = _build_shim(args.scratch) if args.shim_ms else None
    try:
        server.upload_tree(photos, "gs://bkt/photos")
        os.environ["STORAGE_EMULATOR_HOST"] = proxy.url  # every gs:// request of the converter goes through the proxy
        reads_list = [int(r) for r in args.reads.split(",")]
        configs = {"local disk, 16 in flight": (photos, 16, None, None), "local disk, 1 at a time": (photos, 1, None, None)}
        if shim:
            for reads in reads_list:
                env = dict(os.environ, LD_PRELOAD=shim, LATENCY_PREFIX=photos, LATENCY_US=str(int(args.shim_ms * 1000)))
                configs[f"local disk + shim {args.shim_ms:g} ms per open, {reads} in flight"] = (photos, reads, None, env)
        for delay in (float(d) for d in args.delays.split(",")):
            for reads in reads_list:
                configs[f"gs:// +{delay:g} ms, {reads} in flight"] = ("gs://bkt/photos/", reads, delay, None)
        results = {}
        for rep in range(args.reps):
            for mode in args.modes.split(","):
                names = list(configs) if rep % 2 == 0 else list(configs)[::-1]
                for name in names:
                    src, reads, delay, env = configs[name]
                    proxy.delay = (delay or 0) / 1000.0
                    out = os.path.join(args.scratch, "out")
                    shutil.rmtree(out, ignore_errors=True)
                    convert_bench.set_cache("warm", photos)
                    argv = ["beam-etl", "convert", "--input", src, "--output", out, "--num_shards", str(args.num_shards),
                            "--progress", "none", "--reads_in_flight", str(reads), *MODES[mode]]
                    before = proxy.requests
                    r = convert_bench.run_once(argv, os.path.join(out, ".staging-*", "chunks", "*"), out, env)
                    r["requests"] = proxy.requests - before
                    results.setdefault((mode, name), []).append(r)
                    print(f"# rep {rep + 1} {mode:11} {name:32} wall {r['wall']:6.1f}s startup {r['startup']:.1f}s "
                          f"requests {r['requests']}", flush=True)
    finally:
        proxy.close()
        server.close()
    print(f"\n{images} photos, {args.reps} interleaved reps, {convert_bench.CORES} cores; medians; ratio = images/s over "
          f"encode s / the same store at 0 ms, 16 in flight (local disk for the shim rows)\n")
    print("| mode | input | wall s | encode s | images/s (encode) | ratio | requests per image |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for mode in args.modes.split(","):
        encode = {name: statistics.median(r["wall"] - r["startup"] for r in results[(mode, name)]) for name in configs}
        for name in configs:
            # The emulator competes for the cores: each gs:// row against gs:// at 0 ms, the rest against local disk.
            ref = encode.get("gs:// +0 ms, 16 in flight") if name.startswith("gs://") else None
            ref = ref or encode["local disk, 16 in flight"]
            runs = results[(mode, name)]
            wall = statistics.median(r["wall"] for r in runs)
            per_image = statistics.median(r["requests"] for r in runs) / images
            print(f"| {mode} | {name} | {wall:.1f} | {encode[name]:.1f} | {images / encode[name]:.0f} | "
                  f"{ref / encode[name]:.2f}x | {per_image:.2f} |")


def _build_shim(folder: str) -> str:
    """bench/latency_shim.c compiled into `folder`."""
    out = os.path.join(folder, "latency_shim.so")
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", out, os.path.join(HERE, "latency_shim.c"), "-ldl"], check=True)
    return out


if __name__ == "__main__":
    sys.exit(main())
