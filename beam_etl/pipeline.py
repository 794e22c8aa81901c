"""The convert pipeline: list, encode, write shards, analyse, publish."""

import dataclasses
import uuid

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from beam_etl import images, metadata, progress
from beam_etl.transforms import REJECTS, AnalyzeStatistics, EncodeExamples, ListImages, WriteRejects, WriteShards, WriteShardsWithTFRecordIO


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
    write_index: bool = False  # a DALI .idx beside each shard (staged writer only)

    def options_json(self) -> dict:
        """The options as recorded in dataset.json."""
        out = dataclasses.asdict(self)
        out.update(dataclasses.asdict(self.policy))
        del out["policy"], out["label_names"]
        out["inputs"] = list(self.inputs)
        return out


class _PublishFn(beam.DoFn):
    """Runs once, after everything else: checks the counts, then publishes atomically."""

    def __init__(self, config: ConvertConfig, staging: str):
        self.config, self.staging = config, staging

    def process(self, _, shards, label_counts, reject_counts, inputs, fingerprint, analysis_done, rejects_done):
        from beam_etl import analyze

        config = self.config
        rejected = sum(reject_counts.values())
        try:
            metadata.check_reject_fraction(rejected, inputs, config.max_reject_fraction, config.output)
        except metadata.TooManyRejects:
            metadata.move_rejects(self.staging, config.output)  # so the user can see why
            raise
        statistics = analyze.read_statistics(FileSystems.join(self.staging, "analysis"), config.policy.channels)
        document = metadata.build(
            options=config.options_json(),
            label_names=config.label_names,
            shards=shards,
            label_counts=label_counts,
            reject_counts=reject_counts,
            inputs=inputs,
            fingerprint=fingerprint,
            statistics=statistics,
        )
        metadata.publish(self.staging, config.output, document)
        FileSystems.delete([self.staging])
        yield document


def build(p: beam.Pipeline, config: ConvertConfig, run_id: str = "", live_progress: bool = False) -> str:
    """Wire the convert pipeline into `p`; returns the staging folder it uses.

    live_progress: the encoder writes its counts to progress.progress_folder(staging) for the launcher.
    """
    staging = FileSystems.join(config.output, f".staging-{run_id or uuid.uuid4().hex[:12]}")
    refs, fingerprint = p | "ListImages" >> ListImages(config.inputs)
    inputs = refs | "CountInputs" >> beam.combiners.Count.Globally()

    encoded = refs | "EncodeExamples" >> EncodeExamples(
        config.policy,
        config.label_names,
        config.schema,
        config.validation_fraction,
        config.test_fraction,
        int(config.max_file_mb * 1e6),
        progress.progress_folder(staging) if live_progress else None,
    )
    if config.writer == "tfrecordio":
        shards = encoded.records | "WriteShards" >> WriteShardsWithTFRecordIO(FileSystems.join(staging, "shards"), config.num_shards, config.compression)
    else:
        shards = encoded.records | "WriteShards" >> WriteShards(
            FileSystems.join(staging, "chunks"),
            FileSystems.join(staging, "shards"),
            config.num_shards,
            config.shard_size_mb,
            config.compression,
            config.write_index,
        )
    # shards: one dict per shard written
    label_counts = (
        encoded.facts
        | "SplitLabel" >> beam.Map(lambda f: (f.split, f.label_text))
        | "CountLabels" >> beam.combiners.Count.PerElement()
    )
    rejects = encoded[REJECTS]
    reject_counts = rejects | "Reason" >> beam.Map(lambda row: row["reason"]) | "CountReasons" >> beam.combiners.Count.PerElement()
    rejects_written = rejects | "WriteRejects" >> WriteRejects(FileSystems.join(staging, metadata.REJECTED_JSONL))
    analysis = encoded.facts | "AnalyzeStatistics" >> AnalyzeStatistics(
        config.label_names, config.policy.channels, FileSystems.join(staging, "analysis"), FileSystems.join(staging, "tft_tmp")
    )
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
            analysis_done=beam.pvalue.AsList(analysis),
            rejects_done=beam.pvalue.AsList(rejects_written),
        )
    )
    return staging
