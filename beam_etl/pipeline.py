"""The convert pipeline: list, encode, write shards, analyse, publish."""

import dataclasses
import posixpath
import threading
import uuid

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from beam_etl import images, ledger, metadata, objstore, progress, records, runners, workpool
from beam_etl.transforms import (
    CHUNKS,
    REJECTS,
    DropKeys,
    EncodeExamples,
    ListImages,
    SummarizeTraining,
    WriteLedger,
    WriteRejects,
    WriteShards,
    WriteShardsWithTFRecordIO,
)


@dataclasses.dataclass(frozen=True)
class ConvertConfig:
    """The app settings of one conversion (the Beam ones live in PipelineOptions)."""

    inputs: tuple
    output: str
    label_names: tuple
    policy: images.Policy
    schema: str = "default"
    validation_fraction: float = 0.0
    test_fraction: float = 0.0
    num_shards: object = None  # int, {split: int} or None
    shard_size_mb: float = 256.0
    compression: str = "none"
    max_reject_fraction: float = 0.05
    max_file_mb: float = 64.0
    writer: str = "staged"  # "staged" (ours, flat memory everywhere) or "tfrecordio" (beam.io.WriteToTFRecord)
    write_index: bool = False  # a DALI .idx beside each shard
    dedup: bool = False  # drop exact duplicates, keyed on the sha256 of the decoded pixels
    image_timeout_s: float = images.DEFAULT_TIMEOUT_S  # per image, validation and encode
    image_memory_mb: int = 0  # memory cap per encode-pool process; 0: workpool.default_memory_limit
    filesystem_flags: tuple = ()  # the Beam flags FileSystems needs in every process (S3 endpoint, keys)
    reads_in_flight: int = 1  # reads kept ahead of the decode in each worker (readahead.py)
    encode_processes: int = 0  # >1: decode, encode and write shards in that many processes beside the Beam worker (DirectRunner)
    listed_inputs: int = 0  # inputs the launcher's early check found, capped (sources.check_inputs): sizes the pool
    transform_helper: tuple = ()  # (folder, pid) of transform_helper on this machine, or () to write the graph at publish

    def options_json(self) -> dict:
        """The options as recorded in dataset.json."""
        out = dataclasses.asdict(self)
        out.update(dataclasses.asdict(self.policy))
        del out["policy"], out["label_names"], out["encode_processes"], out["reads_in_flight"]  # speed, not content
        del out["transform_helper"], out["listed_inputs"]
        del out["filesystem_flags"]  # where, not what; and it may hold keys
        out["inputs"] = list(self.inputs)
        return out


class _PublishFn(beam.DoFn):
    """Runs once, after everything else: checks the counts, writes the transform graph, publishes atomically."""

    def __init__(self, config: ConvertConfig, staging: str):
        self.config, self.staging = config, staging

    def setup(self):
        objstore.configure(self.config.filesystem_flags, [self.config.output])  # in a worker of its own, too

    def process(self, _, shards, label_counts, reject_counts, inputs, fingerprint, leaks, duplicates, summary, rejects_done, ledger_files):
        import shutil
        import tempfile

        config = self.config
        removed = reject_counts.get(images.DUPLICATE, 0)  # asked for with --dedup: not a failure
        rejected = sum(reject_counts.values()) - removed
        try:
            metadata.check_reject_fraction(rejected, inputs - removed, config.max_reject_fraction, config.output)
        except metadata.TooManyRejects:
            metadata.move_rejects(self.staging, config.output)  # so the user can see why
            raise
        from beam_etl import transform_helper

        # Every shard is written: the chunks are read no more. Deleting them (GBs; on a disk
        # mounted with `discard`, seconds of synchronous trims) overlaps the graph's wait.
        dropping = threading.Thread(target=_drop_quietly, args=(FileSystems.join(self.staging, "chunks"),),
                                    name="drop-chunks", daemon=True)
        dropping.start()
        work = None  # a local folder for the graph, made only when this worker writes it
        try:
            built = None  # (the graph's folder, its statistics)
            if config.transform_helper:
                built = transform_helper.hand_over(*config.transform_helper, config.label_names, config.policy.channels, summary)
            if built is None:  # no helper (Flink, Dataflow), or it failed: TensorFlow's only import, here
                from beam_etl import analyze

                work = tempfile.mkdtemp(prefix="beam-etl-analysis-")
                built = analyze.build(work, config.label_names, config.policy.channels, summary)
            analysis, statistics = built
            document = metadata.build(
                options=config.options_json(),
                label_names=config.label_names,
                shards=shards,
                label_counts=label_counts,
                reject_counts=reject_counts,
                inputs=inputs,
                fingerprint=fingerprint,
                statistics=statistics,
                leaks=leaks,
                duplicates=duplicates,
                workers=runners.checked_in(runners.checkin_folder(self.staging)),
                ledger_files=[posixpath.basename(path) for path in ledger_files],
            )
            metadata.publish(self.staging, config.output, document, analysis)
        finally:
            if work:
                shutil.rmtree(work, ignore_errors=True)
            dropping.join()
        objstore.delete_tree(self.staging)
        metadata.remove_stale_staging(config.output)  # what killed runs left behind: never published, now superseded
        yield document


def _drop_quietly(folder: str) -> None:
    """delete_tree(folder), where a failure is not one: the staging folder's own delete follows it."""
    try:
        objstore.delete_tree(folder)
    except OSError:  # BeamIOError too; absent (no chunks staged there), or left to that delete
        pass


def _pool_does_the_spreading(p: beam.Pipeline, config: ConvertConfig) -> bool:
    """One in_memory DirectRunner worker with an encode pool: a shuffle before it only delays the first image."""
    return config.encode_processes > 1 and progress.direct_mode(p.options) == "in_memory"


def settings_of(config: ConvertConfig) -> records.Settings:
    """What the per-image work needs of a conversion's config."""
    return records.Settings(
        config.policy,
        {name: i for i, name in enumerate(config.label_names)},
        config.schema,
        config.validation_fraction,
        config.test_fraction,
        int(config.max_file_mb * 1e6),
        filesystem_flags=config.filesystem_flags,
        reads_in_flight=config.reads_in_flight,
        timeout_s=config.image_timeout_s,
        memory_limit_bytes=(config.image_memory_mb << 20) or workpool.default_memory_limit(config.encode_processes),
    )


def build(p: beam.Pipeline, config: ConvertConfig, run_id: str = "", live_progress: bool = False) -> str:
    """Wire the convert pipeline into `p`; returns the staging folder it uses.

    live_progress: the encoder writes its counts to progress.progress_folder(staging) for the launcher.
    """
    staging = FileSystems.join(config.output, f".staging-{run_id or uuid.uuid4().hex[:12]}")
    checkin = runners.checkin_folder(staging)  # each worker process leaves its name here
    listing = ListImages(config.inputs, not _pool_does_the_spreading(p, config), config.filesystem_flags, checkin)
    refs, fingerprint, inputs = p | "ListImages" >> listing

    settings = settings_of(config)
    progress_dir = progress.progress_folder(staging) if live_progress else None
    chunk_dir = FileSystems.join(staging, "chunks")
    # The DirectRunner's pool writes the chunks itself: no payload back to the Beam worker. Elsewhere a
    # pool (asked for) returns the records, and the runner's worker stages them as it always has.
    pool_stages = config.writer == "staged" and _pool_does_the_spreading(p, config)
    encoded = refs | "EncodeExamples" >> EncodeExamples(settings, config.encode_processes, progress_dir, checkin,
                                                        chunk_dir if pool_stages else None)
    facts, dropped_keys, dropped_rows = encoded.facts, None, None
    if config.dedup:
        dropped_rows = (
            encoded.facts
            | "ByPixels" >> beam.Map(lambda f: (f.pixel_sha256, (f.key, f.split, f.label_text, f.uri, f.source_bytes, f.mtime)))
            | "GroupPixels" >> beam.GroupByKey()
            | "Duplicates" >> beam.FlatMapTuple(records.duplicates_to_drop)
        )
        dropped_keys = dropped_rows | "DroppedKey" >> beam.Map(lambda row: row["key"])
        facts = encoded.facts | "Kept" >> beam.ParDo(DropKeys(lambda f: f.key), dropped=beam.pvalue.AsList(dropped_keys))
    # facts: one per record that will be written
    by_bytes = (
        facts
        | "ByBytes" >> beam.Map(lambda f: (f.sha256, (f.split, f.key)))
        | "GroupBytes" >> beam.GroupByKey()
        | "Repeated" >> beam.Filter(lambda kv: len(kv[1]) > 1)
        # (stored-bytes sha256, [(split, key), ...]) for images stored more than once
    )
    leaks = by_bytes | "Leakage" >> beam.MapTuple(records.leakage) | "Leaks" >> beam.Filter(lambda group: group is not None)
    duplicates = by_bytes | "CountExtra" >> beam.MapTuple(lambda _, members: len(list(members)) - 1)
    if config.writer == "tfrecordio":
        shards = encoded.records | "WriteShards" >> WriteShardsWithTFRecordIO(
            FileSystems.join(staging, "shards"), config.num_shards, config.compression, config.schema, dropped_keys, config.write_index
        )
    else:
        shards = (encoded[CHUNKS] if pool_stages else encoded.records) | "WriteShards" >> WriteShards(
            chunk_dir,
            FileSystems.join(staging, "shards"),
            config.num_shards,
            config.shard_size_mb,
            config.compression,
            config.write_index,
            config.schema,
            dropped_keys,
            config.encode_processes,
            config.filesystem_flags,
            prestaged=pool_stages,
        )
    # shards: one dict per shard written
    label_counts = (
        facts
        | "SplitLabel" >> beam.Map(lambda f: (f.split, f.label_text))
        | "CountLabels" >> beam.combiners.Count.PerElement()
    )
    rejects = encoded[REJECTS] if dropped_rows is None else (encoded[REJECTS], dropped_rows) | "AllRejects" >> beam.Flatten()
    reject_counts = rejects | "Reason" >> beam.Map(lambda row: row["reason"]) | "CountReasons" >> beam.combiners.Count.PerElement()
    rejects_written = rejects | "WriteRejects" >> WriteRejects(FileSystems.join(staging, metadata.REJECTED_JSONL))
    ledger_files = (facts, rejects) | "WriteLedger" >> WriteLedger(FileSystems.join(staging, ledger.LEDGER_DIR))
    summary = facts | "SummarizeTraining" >> SummarizeTraining(config.policy.channels)
    _ = (
        p
        | "Once" >> beam.Create([None])
        | "Publish"
        >> beam.ParDo(
            _PublishFn(config, staging),
            shards=beam.pvalue.AsList(shards),
            label_counts=beam.pvalue.AsList(label_counts),
            reject_counts=beam.pvalue.AsDict(reject_counts),
            inputs=beam.pvalue.AsSingleton(inputs),
            fingerprint=beam.pvalue.AsSingleton(fingerprint),
            leaks=beam.pvalue.AsList(leaks),
            duplicates=beam.pvalue.AsList(duplicates),
            summary=beam.pvalue.AsSingleton(summary),
            rejects_done=beam.pvalue.AsList(rejects_written),
            ledger_files=beam.pvalue.AsList(ledger_files),
        )
    )
    return staging
