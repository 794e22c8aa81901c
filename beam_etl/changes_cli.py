"""`beam-etl changes`: what `convert --update` would do to a dataset, reading only what changed."""

import sys


def add_parser(sub) -> None:
    p = sub.add_parser("changes", help="compare inputs with a converted dataset: new, changed, relabelled, removed",
                       description="List the inputs and compare each key with the dataset's ledger. Only a key whose "
                                   "listed size or mtime differs is read (and hashed); nothing is written.")
    p.add_argument("--input", action="append", required=True, help="as for convert: a folder, a glob or a CSV/JSONL manifest; repeatable")
    p.add_argument("--output", required=True, help="the dataset folder that convert wrote")


def main(args, beam_args) -> int:
    from beam_etl import changes, ledger, objstore, sources

    objstore.configure(beam_args, [*args.input, args.output])
    try:
        sources.check_inputs(args.input)
        counts, read = changes.run(args.input, args.output, beam_args)
    except (changes.NoLedger, sources.InputError) as e:
        print(f"beam-etl: {e}", file=sys.stderr)
        return 2
    print(ledger.summary_line(counts, args.output, read))
    return 0
