"""`beam-etl compact` and `beam-etl gc`: keep a versioned dataset (convert --update) compact and small."""

import sys


def add_parsers(sub) -> None:
    p = sub.add_parser("compact", help="rewrite small or mostly-dropped generations of a dataset into full-size shards, as a new version",
                       description="Publish the next version of DIR with the shards of its small generations (one per "
                                   "`convert --update`) and of generations with many dropped records rewritten into "
                                   "full-size shards of one new generation. No image is decoded; the other shards stay "
                                   "as they are. Old versions stay readable until `beam-etl gc` removes them.")
    p.add_argument("dir", help="the dataset folder (local, gs:// or s3://)")
    p.add_argument("--shard_size_mb", type=float, default=0.0, help="aim for shards of about this size (default: the size the dataset was converted with)")
    p.add_argument("--max_excluded_fraction", type=float, default=None,
                   help="rewrite a generation once more than this fraction of its records is dropped (default 0.1)")
    p = sub.add_parser("gc", help="remove the files that only old versions of a dataset name",
                       description="Remove the shards, ledger files, documents and graphs that no version among the "
                                   "newest N names. Nothing a kept version names, and nothing the dataset did not "
                                   "write, is touched.")
    p.add_argument("dir", help="the dataset folder (local, gs:// or s3://)")
    p.add_argument("--keep", type=int, required=True, help="how many of the newest versions to keep (1: the latest only)")


def main(args, filesystem_flags=()) -> int:
    from beam_etl import compact, metadata, prune, tfrecord, update

    try:
        if args.command == "compact":
            fraction = compact.MAX_EXCLUDED_FRACTION if args.max_excluded_fraction is None else args.max_excluded_fraction
            if not 0 <= fraction <= 1 or args.shard_size_mb < 0:
                raise ValueError(f"--max_excluded_fraction must be in [0, 1] and --shard_size_mb positive; got {fraction}, {args.shard_size_mb}")
            done = compact.compact(args.dir, args.shard_size_mb, fraction, filesystem_flags)
            if not done["compacted"]:
                print(f"{args.dir}: version {done['version']} is already compact (no small generations to merge, none over "
                      f"{fraction:g} dropped); nothing written")
            else:
                print(f"{args.dir}: version {done['version']}: generations {done['generations']} rewritten, {done['read']} records read, "
                      f"{done['written']} written, {done['dropped']} dropped ones left out; `beam-etl gc {args.dir} --keep 1` removes the old shards")
            return 0
        done = prune.gc(args.dir, args.keep)
        kept = f"{args.dir}: kept versions {metadata.ranges(done['kept'])}"
        if not done["dropped"]:
            print(f"{kept}; no older version to remove")
        else:
            print(f"{kept}; removed versions {metadata.ranges(done['dropped'])}: {done['files']} files, {done['bytes'] / 1e6:.1f} MB")
        return 0
    except (compact.NotCompactable, update.ConcurrentUpdate, metadata.IncompleteDataset, tfrecord.CorruptRecord, ValueError, FileNotFoundError) as e:
        print(f"beam-etl {args.command}: {e}", file=sys.stderr)
        return 2
