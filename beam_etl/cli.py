"""`beam-etl`: argparse for the app flags; every other flag goes to Beam's PipelineOptions."""

import argparse
import dataclasses
import json
import logging
import os
import sys
import time

from beam_etl import changes_cli, flink_cli, versions_cli

EXIT_USAGE = 2
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130  # as a shell reports a command ended by Ctrl-C


def _convert_parser(sub):
    from beam_etl import workpool  # no Beam, no Pillow: --help stays fast

    p = sub.add_parser("convert", help="images to sharded TFRecords", description="Convert images into a dataset directory of sharded TFRecords. Flags not listed here go to Beam (--runner, --direct_num_workers, --temp_location, ...).")
    p.add_argument("--input", action="append", required=True, help="an image folder ROOT/<label>/..., a glob, or a .csv/.jsonl manifest of path,label[,split]; repeatable")
    p.add_argument("--output", required=True, help="the dataset directory to write (local, gs://, s3://)")
    p.add_argument("--labels", help="comma-separated label names, fixing the label set and ids; default: every label found")
    p.add_argument("--schema", choices=("default", "imagenet"), default="default", help="feature names: default (image, label, ...) or the tf-slim/TPU imagenet names")
    p.add_argument("--channels", type=int, choices=(1, 3), default=3, help="3: RGB, 1: grayscale")
    p.add_argument("--image_format", choices=("jpeg", "png"), default="jpeg", help="format of re-encoded images (JPEG inputs that need no change pass through)")
    p.add_argument("--jpeg_quality", type=int, default=95)
    p.add_argument("--max_side", type=int, default=0, help="downsize so the longer side is at most this; 0 keeps the size")
    p.add_argument("--max_pixels", type=int, default=100_000_000, help="reject images with more pixels, before decoding them")
    p.add_argument("--max_file_mb", type=float, default=64.0, help="reject larger files without reading them")
    p.add_argument("--image_timeout", type=float, default=30.0, help="seconds one image's validation and encode may take; past it the image is rejected as timeout and the job goes on (default: %(default)g)")
    p.add_argument("--image_memory_mb", type=int, default=0, help="memory (private data) each encode-pool process may use; an image whose work needs more is rejected as too_large (default 0: half this machine's memory over the pool's processes, "
                   f"here {workpool.default_memory_limit(workpool.cores()) >> 20:,} MB each for {workpool.cores()}). Without a pool, an image whose size says it may need over half of it is converted in a process of its own under it")
    p.add_argument("--validation_fraction", type=float, default=0.0, help="split off this fraction by a stable hash of the key, where the input gives no split")
    p.add_argument("--test_fraction", type=float, default=0.0)
    p.add_argument("--num_shards", help="shards per split: 64, or train=64,validation=8; overrides --shard_size_mb")
    p.add_argument("--shard_size_mb", type=float, default=256.0, help="aim for shards of about this size (100 MB to 1 GB suits most readers)")
    p.add_argument("--compression", choices=("none", "gzip"), default="none", help="gzip saves little on JPEG bytes and writes ~35x slower")
    p.add_argument("--max_reject_fraction", type=float, default=0.05, help="fail the job when more inputs than this are rejected")
    p.add_argument("--overwrite", action="store_true", help="replace a complete dataset already in --output")
    p.add_argument("--update", action="store_true", help="add the next version of the dataset in --output: convert only new and changed "
                   "images, carry the rest unread (its options are the dataset's; see README 'Versions')")
    p.add_argument("--dedup", action="store_true", help="drop exact duplicates (same decoded pixels), keeping the first by key; each dropped one is reported")
    p.add_argument("--writer", choices=("auto", "staged", "tfrecordio"), default="auto", help="auto: staged, on every runner (it reads each staged byte once and shuffles no payloads); tfrecordio: beam.io.WriteToTFRecord (needs --num_shards)")
    p.add_argument("--write_index", action="store_true", help="write a DALI index (tfrecord2idx format) beside each shard: SHARD.idx; needs --compression none")
    p.add_argument("--encode_processes", default="auto", help="processes that decode and encode images, then write shards, beside each Beam worker; auto: every core on the DirectRunner's in_memory mode (its default here) for a job of 1,000 inputs or more, 0 for a smaller one (the pool's start costs more than it saves) and elsewhere: Dataflow and Flink already run one worker per core")
    p.add_argument("--reads_in_flight", type=int, default=16, help="reads kept ahead of the decode in each worker, so an object store's 10-50 ms per request overlaps other work; 1 reads one image at a time")
    p.add_argument("--worker_start_timeout", default="auto", help="seconds to wait for the first SDK worker process to run a bundle before failing the job; auto: 120 for EXTERNAL, PROCESS, LOOPBACK and DOCKER environments (a worker pool), 600 on a job server (Flink: longer than Flink takes to restart a job whose worker died), off on the DirectRunner and Dataflow; 0 waits forever")
    p.add_argument("--progress", choices=("auto", "bar", "log", "none"), default="auto", help="DirectRunner progress: auto is a bar on a terminal, log lines otherwise")
    p.add_argument("--progress_interval", type=float, default=0.0, help="seconds between progress reports; default 0.5 for the bar, 10 for log lines")
    return p


def _inspect_parser(sub):
    p = sub.add_parser("inspect", help="report on a dataset directory", description="Print a dataset's splits, shard sizes, class histograms, image sizes, rejects, duplicates and split leakage, read from dataset.json and the shards.")
    p.add_argument("dir", help="a dataset directory written by `beam-etl convert`")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of text")
    p.add_argument("--preview", help="also write a contact sheet of decoded images to this PNG file")
    p.add_argument("--per_class", type=int, default=8, help="images per class in the --preview sheet")
    return p


def _index_parser(sub):
    p = sub.add_parser("index", help="add DALI index files to a dataset", description="Write SHARD.idx beside every shard of an uncompressed dataset, in DALI's tfrecord2idx format, and record it in dataset.json.")
    p.add_argument("dir", help="a dataset directory written by `beam-etl convert --compression none`")
    return p


def _verify_parser(sub):
    p = sub.add_parser("verify", help="re-read a dataset and check it against dataset.json", description="Re-read every shard: CRCs, record counts, sizes and sha256 against dataset.json, and decode every image. Exits 1 on any mismatch.")
    p.add_argument("data_dir")
    p.add_argument("--no_decode", action="store_true", help="skip decoding the images (CRCs, counts and checksums only)")
    p.add_argument("--version", type=int, default=None, help="check this version of an updated dataset (versions/); default: the latest")
    return p


def verify(args) -> int:
    """Check a dataset; returns the exit code."""
    from beam_etl import metadata
    from beam_etl.verify import verify as run_checks

    if not metadata.is_complete(args.data_dir):
        return _usage_error(f"{args.data_dir}: no dataset.json, so not a complete dataset; convert into it first")
    try:
        problems = run_checks(args.data_dir, decode=not args.no_decode, version=args.version)
    except ValueError as e:  # no such version
        return _usage_error(str(e))
    for problem in problems:
        print(f"beam-etl verify: {problem}", file=sys.stderr)
    if problems:
        print(f"FAILED: {len(problems)} problems in {args.data_dir}", file=sys.stderr)
        return EXIT_FAILED
    print(f"OK: {args.data_dir} matches its dataset.json")
    return 0


def _fingerprint_parser(sub):
    p = sub.add_parser("fingerprint", help="print the source fingerprint of inputs, as dataset.json records it", description="List the inputs (no conversion) and print their fingerprint: the same value as source_fingerprint in a dataset.json converted from them.")
    p.add_argument("--input", action="append", required=True, help="as for convert; repeatable")
    return p


def fingerprint(args) -> int:
    from beam_etl import sources

    try:
        sources.check_inputs(args.input)
    except ValueError as e:  # InputError, objstore.StorageError
        return _usage_error(str(e))
    print(sources.fingerprint(args.input))
    return 0


def _usage_error(message: str) -> int:
    print(f"beam-etl: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _pipeline_options(beam_args):
    from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions

    from beam_etl import progress, runners, workpool

    options = PipelineOptions(beam_args)
    parallel = progress.direct_mode(options) not in (None, "in_memory") or runners.embedded_external(options)
    if parallel and "--direct_num_workers" not in " ".join(beam_args):
        options.view_as(DirectOptions).direct_num_workers = workpool.cores()  # Beam's default of one worker makes these modes pointless
    return options


# Below this many inputs `auto` encodes in the Beam worker: starting the pool (a forkserver that
# imports Beam and Pillow, then a process per core) costs more than it saves (BENCHMARKS §13).
SMALL_JOB = 1000


def _encode_processes(value: str, options, listed: int = SMALL_JOB) -> int:
    """--encode_processes: auto is every core on the DirectRunner's in_memory mode, else 0.

    The DirectRunner's default, one in_memory worker plus this pool, uses every core with no
    gRPC hop per image; multi_threading is bound by the GIL and multi_processing copies the
    job into every worker (docs/BENCHMARKS.md). listed: the inputs the early check found
    (capped); a smaller job than SMALL_JOB gets no pool.
    """
    from beam_etl import progress, workpool

    if value != "auto":
        try:
            processes = int(value)
        except ValueError:
            raise ValueError(f"--encode_processes must be auto or a number of processes, got {value!r}") from None
        if processes < 0:
            raise ValueError(f"--encode_processes must be 0 or more, got {processes}")
        return processes
    pool = progress.direct_mode(options) == "in_memory" and workpool.cores() > 1 and listed >= SMALL_JOB
    return workpool.cores() if pool else 0


def _writer(args, beam_args) -> str:
    """Which shard writer: see README 'Writing shards'."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_etl import progress

    # auto: staged on every runner and output. It reads each staged byte once and sends only
    # descriptors through the shuffle; tfrecordio sends every payload through it and reads each
    # shard back to describe it (bench/writer_io_bench.py, README 'Writing shards').
    writer = "staged" if args.writer == "auto" else args.writer
    mode = progress.direct_mode(PipelineOptions(beam_args))  # None off the DirectRunner
    if writer == "tfrecordio" and mode == "multi_threading":
        # Beam 2.77's multi_threading mode drops a few large elements on their way into a
        # GroupByKey (reproduced with Beam alone: docs/BENCHMARKS.md, "Records lost").
        raise ValueError(
            "--writer tfrecordio loses records on the DirectRunner's multi_threading mode (a Beam bug, "
            "see docs/BENCHMARKS.md); use --writer staged, or --direct_running_mode in_memory or multi_processing"
        )
    if writer == "tfrecordio":
        from beam_etl import sharding

        if sharding.parse_num_shards(args.num_shards) is None:
            raise ValueError(
                "beam.io.WriteToTFRecord fixes the shard count when the graph is built: give --num_shards N "
                "or --num_shards train=N,validation=M (a split not named gets 1), or pass --writer staged"
            )
    return writer


def _config(args, beam_args=()):
    from beam_etl import images, sharding, sources
    from beam_etl.pipeline import ConvertConfig

    labels = [name.strip() for name in args.labels.split(",") if name.strip()] if args.labels else None
    if labels is not None and len(set(labels)) != len(labels):
        raise ValueError(f"--labels has duplicates: {args.labels!r}")
    for name in ("validation_fraction", "test_fraction", "max_reject_fraction"):
        if not 0.0 <= getattr(args, name) <= 1.0:
            raise ValueError(f"--{name} must be in [0, 1], got {getattr(args, name)}")
    if args.validation_fraction + args.test_fraction >= 1.0:
        raise ValueError("--validation_fraction + --test_fraction must leave some training data")
    if args.shard_size_mb <= 0 or args.max_file_mb <= 0:
        raise ValueError("--shard_size_mb and --max_file_mb must be positive")
    if args.reads_in_flight < 1:
        raise ValueError(f"--reads_in_flight must be 1 or more, got {args.reads_in_flight}")
    if args.image_timeout <= 0 or args.image_memory_mb < 0:
        raise ValueError(f"--image_timeout must be positive and --image_memory_mb 0 or more, got {args.image_timeout} and {args.image_memory_mb}")
    if args.write_index and args.compression != "none":
        raise ValueError(f"--write_index needs --compression none: DALI indexes only uncompressed TFRecords, and --compression is {args.compression}")
    policy = images.Policy(channels=args.channels, image_format=args.image_format, jpeg_quality=args.jpeg_quality, max_side=args.max_side, max_pixels=args.max_pixels, pixel_hash=args.dedup)
    listed = sources.check_inputs(args.input, labels)
    label_names = sorted(labels) if labels is not None else sources.label_names(args.input)
    if not label_names:
        raise sources.InputError(f"no labels found in {args.input}; expected ROOT/<label>/<image> folders or a manifest with a label column")
    return ConvertConfig(
        inputs=tuple(args.input),
        output=args.output.rstrip("/"),
        label_names=tuple(label_names),
        policy=policy,
        schema=args.schema,
        validation_fraction=args.validation_fraction,
        test_fraction=args.test_fraction,
        num_shards=sharding.parse_num_shards(args.num_shards),
        shard_size_mb=args.shard_size_mb,
        compression=args.compression,
        max_reject_fraction=args.max_reject_fraction,
        max_file_mb=args.max_file_mb,
        writer=_writer(args, list(beam_args)),
        write_index=args.write_index,
        dedup=args.dedup,
        reads_in_flight=args.reads_in_flight,
        listed_inputs=listed,
        image_timeout_s=args.image_timeout,
        image_memory_mb=args.image_memory_mb,
    )


def _update_config(config, args):
    """(the latest document, the config) for --update: the dataset's own options, the inputs' labels checked."""
    import dataclasses as dc

    from beam_etl import images, metadata, update

    if args.overwrite:
        raise ValueError("--update and --overwrite exclude each other: --update adds a version, --overwrite replaces the dataset")
    if not metadata.is_complete(config.output):
        raise ValueError(f"--update needs a dataset in --output {config.output}; convert into it first (without --update)")
    document = metadata.read(config.output)
    update.check_updatable(document, config.output, config.label_names)
    options = document["options"]
    policy = images.Policy(**{f.name: options[f.name] for f in dc.fields(images.Policy) if f.name in options})
    same = ("schema", "validation_fraction", "test_fraction", "compression", "max_file_mb", "shard_size_mb", "write_index")
    config = dc.replace(config, policy=policy, label_names=tuple(document["label_names"]), num_shards=None, **{k: options[k] for k in same})
    return document, config


def _updated(result, output: str) -> bool:
    """Print what --update did; False when there was nothing to do (no version written)."""
    from beam_etl import changes, ledger, metadata, progress

    counts = {v: progress.counter_total(result, changes.counter_name(v)) for v in ledger.VERDICTS}
    read = progress.counter_total(result, changes.READ)
    if not sum(counts.get(v, 0) for v in (ledger.NEW, ledger.CHANGED, ledger.RELABELLED, ledger.REMOVED)):
        print(f"beam-etl: {ledger.summary_line(counts, output, read)}; no version written")
        return False
    version = metadata.read(output).get("version", 1)
    decoded = progress.counter_total(result, "images_encoded") + progress.counter_total(result, "images_rejected")
    rebuilt = progress.counter_total(result, "images_relabelled")
    print(f"beam-etl: version {version} of {output}: " + ", ".join(f"{counts[v]:,} {v}" for v in ledger.VERDICTS)
          + f"; {read:,} read to tell changed from touched; {decoded:,} converted, {rebuilt:,} relabelled without a decode")
    return True


class Unchanged(Exception):
    """The output already holds this conversion of these inputs: nothing to do."""


def _prepare_output(config, overwrite: bool) -> None:
    """Make sure the output can be written; raise Unchanged when the run would be a no-op."""
    from apache_beam.io.filesystems import FileSystems

    from beam_etl import metadata, objstore, sources

    output = config.output
    objstore.check_output(output)
    if metadata.is_complete(output) and not overwrite:
        existing = metadata.read(output)
        same_options = json.loads(json.dumps(config.options_json())) == existing.get("options")
        if same_options and existing.get("source_fingerprint") == sources.fingerprint(config.inputs):
            raise Unchanged(f"{output} is up to date: same inputs (fingerprint {existing['source_fingerprint']}) and options; nothing to do")
        raise ValueError(f"--output {output} already holds a complete dataset of other inputs or options; pass --overwrite to replace it")
    if "://" not in output:
        try:
            os.makedirs(output, exist_ok=True)
        except OSError as e:
            raise ValueError(f"--output {output}: cannot create it ({e.strerror})") from None
        if not os.access(output, os.W_OK | os.X_OK):
            raise ValueError(f"--output {output}: not writable")
    else:
        FileSystems.mkdirs(output) if not FileSystems.exists(output) else None


def _root_cause(exc: BaseException, options) -> str:
    """Beam wraps a DoFn's exception in its own; find ours by its class name in the text."""
    from beam_etl import metadata, runners

    text = str(exc)
    if isinstance(exc, runners.WorkersNeverConnected):
        return text
    explained = runners.explain(text, options)
    if explained:
        return explained
    for cls in (metadata.TooManyRejects, metadata.IncompleteDataset):
        marker = f"{cls.__name__}: "
        if marker in text:
            return text[text.rindex(marker) + len(marker) :].split("\n")[0].split(" [while running")[0]
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def convert(args, beam_args) -> int:
    """Run one conversion; returns the exit code."""
    from beam_etl import transform_helper

    # Before Beam's import: TensorFlow's start-up then overlaps all of the launcher's.
    helper = transform_helper.start() if _direct_runner(beam_args) else ()
    try:
        return _convert(args, beam_args, helper)
    finally:
        transform_helper.stop_all()  # done, or its job failed: either way, no process outlives the command


def _direct_runner(beam_args) -> bool:
    """--runner is absent or names the DirectRunner: the publish step runs on this machine."""
    runner = ""
    for i, arg in enumerate(beam_args):
        if arg.startswith("--runner="):
            runner = arg.partition("=")[2]
        elif arg == "--runner" and i + 1 < len(beam_args):
            runner = beam_args[i + 1]
    from beam_etl import progress  # no Beam import at its top

    return not runner or runner.split(".")[-1] in progress.DIRECT_RUNNERS


def _convert(args, beam_args, helper) -> int:
    import apache_beam as beam

    from beam_etl import objstore, pipeline, progress, report, runners, sources, transforms, workpool

    started = time.time()
    try:
        options = _pipeline_options(beam_args)
        runners.check_job_server(options)
        if runners.on_job_server(options):
            runners.name_job(options)  # before beam.Pipeline copies the options: the job is found by it
        start_timeout = runners.start_timeout(options, args.worker_start_timeout)
        objstore.configure(beam_args, [*args.input, args.output])  # before the first bucket call
        config = _config(args, beam_args)
        config = dataclasses.replace(
            config,
            encode_processes=_encode_processes(args.encode_processes, options, config.listed_inputs),
            filesystem_flags=tuple(beam_args),
        )
        document = None
        if args.update:
            document, config = _update_config(config, args)
        else:
            _prepare_output(config, args.overwrite)
        if config.encode_processes > 1:
            workpool.warm(config.encode_processes)  # their start-up overlaps Beam's
        if helper and progress.is_direct(options):  # started in convert(): the publish step runs on this machine
            config = dataclasses.replace(config, transform_helper=helper)
    except Unchanged as e:
        print(f"beam-etl: {e}")
        return 0
    except (ValueError, sources.InputError) as e:
        return _usage_error(str(e))
    p = beam.Pipeline(runner=runners.build(options), options=options)
    live = progress.is_direct(options) and args.progress != "none" and document is None
    embedded = runners.embedded_external(options)  # in this process: p.run() returns when the job ends
    if document is None:
        staging = pipeline.build(p, config, live_progress=live)
    else:
        from beam_etl import update

        staging = update.build(p, config, document, pipeline.settings_of(config))

    jobs = []

    def submitted(result):
        jobs.append(result)
        if not live and not embedded:
            print("\n".join(progress.watch_lines(result, options)), file=sys.stderr, flush=True)

    if embedded:
        print(runners.describe_embedded(options), file=sys.stderr, flush=True)

    try:
        with progress.Reporter(args.progress if live else "none", progress.progress_folder(staging), config.inputs, args.progress_interval) as reporter:
            result = runners.run(p, options, runners.checkin_folder(staging), start_timeout, submitted)
            reporter.finish(result)
    except KeyboardInterrupt:
        stopped = runners.stop_on_cluster(jobs[-1] if jobs else None, options)
        print(f"beam-etl: interrupted{'; ' + stopped if stopped else ''}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:  # noqa: BLE001 - a Beam job failure surfaces as any type; report it in one line
        stopped = runners.stop_on_cluster(jobs[-1] if jobs else None, options)
        print(f"beam-etl: conversion failed: {_root_cause(e, options)}{'; ' + stopped if stopped else ''}", file=sys.stderr)
        return EXIT_FAILED
    if document is not None and not _updated(result, config.output):
        return 0
    report.print_summary(config.output, time.time() - started)
    lost = progress.counter_total(result, transforms.LOST)
    if lost:  # each cost a rerun of the inputs it held, not the job (workpool.OrderedMap)
        print(f"beam-etl: {lost} encode-pool process{'es' if lost > 1 else ''} died and {'were' if lost > 1 else 'was'} replaced; "
              "the inputs they held were run again (see worker_crashed and timeout in the rejects)", file=sys.stderr)
    shuffled = progress.counter_total(result, transforms.SHUFFLED)
    if shuffled:  # what the writer choice costs on a runner with a real shuffle (README 'Writing shards')
        amount = f"{shuffled / 1e6:,.1f} MB" if shuffled >= 1e6 else f"{shuffled / 1e3:,.1f} kB"
        print(f"beam-etl: the {config.writer} shard writer sent {amount} to the runner's shuffle", file=sys.stderr)
    return 0


def inspect_command(args) -> int:
    """`beam-etl inspect DIR`: the report on stdout, and the --preview sheet."""
    import json

    from beam_etl import inspect, tfrecord

    if args.per_class < 1:
        return _usage_error(f"--per_class must be at least 1, got {args.per_class}")
    try:
        report = inspect.build_report(args.dir, preview_per_class=args.per_class if args.preview else 0)
        if args.preview:
            inspect.write_preview(report, args.preview)
    except inspect.NotADataset as e:
        return _usage_error(str(e))
    except (OSError, tfrecord.CorruptRecord) as e:
        print(f"beam-etl: inspect failed: {e}", file=sys.stderr)
        return EXIT_FAILED
    print(json.dumps(inspect.to_json(report), indent=2) if args.json else "\n".join(inspect.text_lines(report)))
    return 0


def index_command(args) -> int:
    """`beam-etl index DIR`: a DALI index beside every shard of a finished dataset."""
    from beam_etl import index, tfrecord

    try:
        count = index.index_dataset(args.dir.rstrip("/"))
    except index.NotIndexable as e:
        return _usage_error(str(e))
    except (OSError, tfrecord.CorruptRecord) as e:
        print(f"beam-etl: index failed: {e}", file=sys.stderr)
        return EXIT_FAILED
    print(f"wrote {count} index files in {args.dir}")
    return 0


def _not_s3_flags(beam_args) -> list:
    """The arguments that are neither an --s3_* flag nor its value."""
    unknown, after_flag = [], False
    for arg in beam_args:
        if after_flag and not arg.startswith("--"):
            after_flag = False
            continue
        after_flag = arg.startswith("--s3_") and "=" not in arg
        if not arg.startswith("--s3_"):
            unknown.append(arg)
    return unknown


def main(argv=None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up chatter is not for users
    parser = argparse.ArgumentParser(prog="beam-etl", description="Convert images to sharded TFRecords with Apache Beam.")
    sub = parser.add_subparsers(dest="command", required=True)
    _convert_parser(sub)
    _verify_parser(sub)
    _fingerprint_parser(sub)
    _inspect_parser(sub)
    _index_parser(sub)
    flink_cli.add_parser(sub)
    changes_cli.add_parser(sub)
    versions_cli.add_parsers(sub)
    args, beam_args = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("absl").setLevel(logging.ERROR)  # TFT's advice on input formats, every run
    if args.command == "convert":
        return convert(args, beam_args)
    if args.command == "flink":
        if beam_args:
            return _usage_error(f"unrecognized arguments: {' '.join(beam_args)}")
        return flink_cli.main(args)
    if args.command == "changes":
        return changes_cli.main(args, beam_args)
    from beam_etl import objstore

    if args.command == "fingerprint":  # its inputs may be on s3://, which needs the --s3_* flags
        objstore.configure(beam_args, args.input)
        return fingerprint(args)
    # A dataset on s3:// is read with the same --s3_* flags as convert takes; nothing else is Beam's here.
    unknown = _not_s3_flags(beam_args)
    if unknown:
        return _usage_error(f"unrecognized arguments: {' '.join(unknown)}")
    objstore.configure(beam_args, [getattr(args, "data_dir", None) or args.dir])
    if args.command == "verify":
        return verify(args)
    if args.command == "inspect":
        return inspect_command(args)
    if args.command == "index":
        return index_command(args)
    if args.command in ("compact", "gc"):
        return versions_cli.main(args, beam_args)  # only --s3_* flags get here
    return _usage_error(f"unknown command {args.command!r}")


def run() -> None:
    """The console script: main(), then exit without the interpreter's final garbage collection.

    TensorFlow 2.21 with Beam 2.77 segfaults in that collection after a successful run
    (seen here: exit 139 after the summary). Everything is written and flushed by then.
    """
    code = main()
    from beam_etl import workpool  # no Beam import: cheap

    workpool.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
