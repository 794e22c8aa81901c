"""Per-object read cost on gs:// and s3://: Beam's FileSystems.open against objstore.open_read.

    python bench/store_read_bench.py --objects 200 --kb 80 --reps 3

Starts gcp-storage-emulator and moto's server on 127.0.0.1 (tests/objstore_servers.py), uploads
`objects` objects of `kb` KB to each, then reads them all, one after another, both ways, in
interleaved reps. Beam's filesystems build a new client for every open; open_read keeps one per
thread. Reports milliseconds per object (median of the reps) and the ratio.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE)]

from tests.objstore_servers import GcsServer, S3Server  # noqa: E402


def _read_all(open_fn, uris) -> float:
    start = time.perf_counter()
    for uri in uris:
        with open_fn(uri) as f:
            f.read()
    return (time.perf_counter() - start) / len(uris) * 1000


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--objects", type=int, default=200)
    p.add_argument("--kb", type=int, default=80)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args(argv)
    folder = tempfile.mkdtemp(prefix="store-read-bench-")
    gcs, s3 = GcsServer(folder), S3Server(folder)
    try:
        os.environ["STORAGE_EMULATOR_HOST"] = gcs.endpoint
        from apache_beam.io.filesystem import CompressionTypes
        from apache_beam.io.filesystems import FileSystems

        from beam_etl import objstore

        payload = os.urandom(args.kb * 1024)
        uris = {"gs": [f"gs://bkt/bench/{i}.jpg" for i in range(args.objects)],
                "s3": [f"s3://bkt/bench/{i}.jpg" for i in range(args.objects)]}
        for uri in uris["gs"]:
            gcs.upload(uri, payload)
        for uri in uris["s3"]:
            s3.upload(uri, payload)
        objstore.configure(s3.beam_flags, ["gs://bkt/"])
        ways = {
            "FileSystems.open": lambda u: FileSystems.open(u, compression_type=CompressionTypes.UNCOMPRESSED),
            "objstore.open_read": objstore.open_read,
        }
        print(f"{args.objects} objects of {args.kb} KB, {args.reps} interleaved reps, ms per object (median)")
        print(f"{'store':6} {'FileSystems.open':>17} {'objstore.open_read':>19} {'ratio':>7}")
        for kind in ("gs", "s3"):
            times = {name: [] for name in ways}
            for rep in range(args.reps):
                order = list(ways) if rep % 2 == 0 else list(reversed(ways))
                for name in order:
                    times[name].append(_read_all(ways[name], uris[kind]))
            beam, ours = (statistics.median(times[n]) for n in ways)
            print(f"{kind:6} {beam:17.1f} {ours:19.1f} {beam / ours:6.1f}x")
    finally:
        gcs.close()
        s3.close()


if __name__ == "__main__":
    main()
