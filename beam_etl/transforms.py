"""The pipeline's stages, one PTransform each; they only wire the pure functions to Beam."""

import functools
import uuid

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.windowed_value import WindowedValue

from beam_etl import chunks, ledger, objstore, progress, readahead, records, runners, sharding, sources, tfrecord, trainstats, workpool
from beam_etl.images import Rejected

NAMESPACE = progress.NAMESPACE
REJECTS = "rejects"
CHUNKS = "chunks"  # EncodeExamples' staged chunks, when its pool writes them


class _ListFn(beam.DoFn):
    """One --input to its image references (each with its mtime, for the fingerprint)."""

    def __init__(self, uris=(), filesystem_flags=(), checkin=None):
        self.uris, self.filesystem_flags, self.checkin = list(uris), tuple(filesystem_flags), checkin

    def setup(self):
        objstore.configure(self.filesystem_flags, self.uris)  # in a worker of its own, too
        runners.check_in(self.checkin)

    def process(self, uri):
        yield from sources.listing(uri)


class ListImages(beam.PTransform):
    """Inputs to (ImageRefs, source fingerprint, input count), fusion broken so that reading spreads over workers.

    spread=False keeps the listing fused with what reads the images: for the DirectRunner's
    encode pool, which spreads the reading itself. The refs then stream into the encoder as
    they are listed, instead of all being listed and shuffled first (3-4 s at 50k images).
    """

    def __init__(self, uris, spread: bool = True, filesystem_flags=(), checkin=None):
        super().__init__()
        self.uris = list(uris)
        self.spread = spread
        self.filesystem_flags, self.checkin = filesystem_flags, checkin  # see _ListFn

    def expand(self, pbegin):
        listed = (
            pbegin
            | "Inputs" >> beam.Create(self.uris)
            | "List" >> beam.ParDo(_ListFn(self.uris, self.filesystem_flags, self.checkin))
            # (ImageRef, mtime)
        )
        refs = listed | "Refs" >> beam.Map(lambda pair: pair[0])
        if self.spread:
            refs = refs | "BreakFusion" >> beam.Reshuffle()
        fingerprint = (
            listed
            | "Entry" >> beam.Map(lambda pair: sources.fingerprint_entry(pair[0].uri, pair[0].size, pair[1]))
            | "Sum" >> beam.CombineGlobally(lambda entries: sum(entries) % (1 << 128))
            | "Hex" >> beam.Map(lambda total: f"{total:032x}")
        )
        # Counted before the fusion break, so that the publish check (written + rejected ==
        # inputs) also covers what a runner might lose in the shuffle.
        count = listed | "CountInputs" >> beam.combiners.Count.Globally()
        return refs, fingerprint, count


LOST = "pool_processes_lost"  # the counter of encode-pool processes that died (workpool.OrderedMap)


def count_lost(pool) -> None:
    """Add what `pool` lost since the last call to the LOST counter."""
    lost, pool.lost = pool.lost, 0
    if lost:
        Metrics.counter(NAMESPACE, LOST).inc(lost)


class _EncodeFn(beam.DoFn):
    """Reads and encodes each ImageRef, inline or in a process pool (processes > 1; DirectRunner only)."""

    def __init__(self, settings, processes=0, progress_dir=None, checkin=None, chunk_dir=None):
        self.settings = settings
        self.processes = processes
        self.chunk_dir = chunk_dir if processes > 1 else None  # the pool stages the records itself
        self.progress_dir = progress_dir
        self.checkin = checkin  # runners.check_in: which worker processes encode
        self.written = Metrics.counter(NAMESPACE, "images_encoded")
        self.passthrough = Metrics.counter(NAMESPACE, "images_passed_through")
        self.rejected = Metrics.counter(NAMESPACE, "images_rejected")
        self.bytes = Metrics.counter(NAMESPACE, "bytes_encoded")

    def setup(self):
        if self.checkin:  # before any other bucket call of this process (credentials: objstore)
            objstore.configure(self.settings.filesystem_flags, [self.checkin])
        runners.check_in(self.checkin)
        self.progress = progress.tally(self.progress_dir)  # live counts for the launcher; see progress.py

    def start_bundle(self):
        if self.processes > 1:
            convert = (functools.partial(records.stage_chunk, settings=self.settings, chunk_dir=self.chunk_dir) if self.chunk_dir
                       else functools.partial(records.convert_chunk, settings=self.settings))
            self.pool = workpool.OrderedMap(self.processes, convert, describe=lambda ref: ref.uri, per_chunk=True,
                                            on_crash=functools.partial(records.crashed, timeout_s=self.settings.timeout_s))
        else:  # in this worker: reads ahead on threads, so a slow store's latency overlaps the decode
            self.reads = readahead.ReadAhead(functools.partial(records.fetch, settings=self.settings), self.settings.reads_in_flight)

    def finish_bundle(self):
        # What is still in the pool or being read belongs to this bundle: emit it before it ends.
        done = self.pool.drain() if self.processes > 1 else self._converted(self.reads.drain())
        for ref, outcome in done:
            for out in self._outputs(ref, *outcome):
                tag, value = (out.tag, out.value) if isinstance(out, beam.pvalue.TaggedOutput) else (None, out)
                windowed = WindowedValue(value, 0, [GlobalWindow()])
                yield windowed if tag is None else beam.pvalue.TaggedOutput(tag, windowed)
        if self.processes > 1:
            count_lost(self.pool)
        self.progress.flush()

    def process(self, ref):
        done = self.pool.put(ref) if self.processes > 1 else self._converted(self.reads.put(ref))
        for ref_done, outcome in done:
            yield from self._outputs(ref_done, *outcome)

    def _converted(self, reads):
        for ref, fetched in reads:
            yield ref, records.convert_or_reject(ref, self.settings, fetched)

    def _outputs(self, ref, record, reject, staged=()):
        for described in staged:  # (split, (chunk path, examples, bytes)), written by the pool
            yield beam.pvalue.TaggedOutput(CHUNKS, described)
        if reject is not None:
            reason, message = reject
            self.rejected.inc()
            self.progress.add(rejected=1)
            Metrics.counter(NAMESPACE, f"rejected_{reason}").inc()
            yield beam.pvalue.TaggedOutput(REJECTS, records.reject_row(ref, reason, message))
            return
        split, example, facts = record
        self.written.inc()
        self.progress.add(encoded=1)
        self.bytes.inc(facts.nbytes)
        if facts.passthrough:
            self.passthrough.inc()
        yield beam.pvalue.TaggedOutput("facts", facts)
        if example is not None:  # None: staged by the pool
            yield split, example


class EncodeExamples(beam.PTransform):
    """ImageRefs to (split, Example bytes), with Facts, rejects and staged chunks as tagged outputs.

    processes > 1 decodes in that many worker processes beside the Beam worker: for the
    DirectRunner, whose in_memory mode runs Python on one core. Elements then leave in
    input order but possibly in a later call (the global window is the only window here).
    With a chunk_dir too, the pool writes the records to chunks itself (records.stage_chunk):
    "records" stays empty and CHUNKS carries (split, (chunk path, examples, bytes)) for
    WriteShards(prestaged=True), so no payload crosses to the Beam worker.
    """

    def __init__(self, settings, processes=0, progress_dir=None, checkin=None, chunk_dir=None):
        super().__init__()
        self.fn = _EncodeFn(settings, processes, progress_dir, checkin, chunk_dir)

    def expand(self, refs):
        return refs | "Encode" >> beam.ParDo(self.fn).with_outputs(REJECTS, "facts", CHUNKS, main="records")


class _StageFn(beam.DoFn):
    """Writes each bundle's records of a split to chunk files (chunks.py); emits the chunks when the bundle ends.

    Payloads are written where they were made and never cross a shuffle: only the chunk
    descriptors travel. A retried bundle's chunk is never emitted, so it is never read.
    """

    def __init__(self, chunk_dir, filesystem_flags=()):
        self.chunk_dir, self.filesystem_flags = chunk_dir, tuple(filesystem_flags)

    def setup(self):
        objstore.configure_for(self.chunk_dir, self.filesystem_flags)

    def start_bundle(self):
        self.open, self.done = {}, []  # split -> ChunkWriter; [(split, (chunk path, examples, bytes))]

    def process(self, element):
        split, example = element
        writer = self.open.get(split)
        if writer is None:
            writer = self.open[split] = chunks.ChunkWriter(FileSystems.join(self.chunk_dir, f"{split}-{uuid.uuid4().hex}.tfrecord"))
        writer.add(tfrecord.frame(example))
        if writer.nbytes >= chunks.MAX_CHUNK_BYTES:  # bounds the local file: a bundle may be the whole input
            self.done.append((split, writer.publish()))
            del self.open[split]

    def finish_bundle(self):
        for split, writer in self.open.items():
            self.done.append((split, writer.publish()))
        for described in self.done:
            yield WindowedValue(described, 0, [GlobalWindow()])
        self.open, self.done = {}, []

    def teardown(self):
        for writer in getattr(self, "open", {}).values():  # a bundle that failed: nothing of it is read
            writer.discard()


SHUFFLED = "writer_shuffle_bytes"  # what the shard writer hands to a GroupByKey: descriptors or payloads


def _shuffled_size(element) -> int:
    """About what a runner's coder makes of an element: pickle's size (payload bytes plus a few)."""
    import pickle

    return len(pickle.dumps(element, protocol=pickle.HIGHEST_PROTOCOL))


class _CountShuffled(beam.DoFn):
    """Passes elements through, counting their bytes into SHUFFLED: they are about to enter a GroupByKey."""

    def __init__(self):
        self.bytes = Metrics.counter(NAMESPACE, SHUFFLED)

    def process(self, element):
        self.bytes.inc(_shuffled_size(element))
        yield element


class _PlanFn(beam.DoFn):
    """One split's chunks to one task per shard: (split, index, count, [(chunk, start, end, examples)])."""

    def __init__(self, num_shards, shard_size_mb, chunk_dir="", filesystem_flags=()):
        self.num_shards = num_shards
        self.shard_size_mb = shard_size_mb
        self.chunk_dir, self.filesystem_flags = chunk_dir, tuple(filesystem_flags)

    def setup(self):
        objstore.configure_for(self.chunk_dir, self.filesystem_flags)

    def process(self, element, chunk_bytes):
        split, chunk_list = element  # in any order: the plan sorts them
        chunk_list = list(chunk_list)
        examples = sum(n for _, n, _ in chunk_list)
        count = sharding.shard_count(split, examples, chunk_bytes.get(split, 0), self.num_shards, self.shard_size_mb)
        for index, ranges in sharding.plan(chunk_list, count):
            yield split, index, count, ranges


class _WriteShardFn(beam.DoFn):
    """Writes each planned shard, inline or in the process pool (processes > 1; DirectRunner only)."""

    def __init__(self, shard_dir, compression, write_index=False, schema_name="default", processes=0, filesystem_flags=()):
        self.shard_dir, self.filesystem_flags = shard_dir, tuple(filesystem_flags)
        self.compression = compression
        self.write_index = write_index
        self.schema_name = schema_name
        self.processes = processes
        self.shards = Metrics.counter(NAMESPACE, "shards_written")

    def start_bundle(self):
        self.pool = None  # made at the first task: it needs the side input

    def process(self, task, dropped=()):
        write = functools.partial(sharding.write_task, shard_dir=self.shard_dir, compression=self.compression, index=self.write_index, schema_name=self.schema_name, dropped=tuple(dropped),
                                  filesystem_flags=self.filesystem_flags)
        if self.processes <= 1:
            self.shards.inc()
            yield write(task)
            return
        # Shards are independent and writing one is kernel-bound copying: one per core.
        if self.pool is None:
            self.pool = workpool.OrderedMap(self.processes, write, chunk_size=1, describe=lambda t: f"shard {t[1]} of {t[0]}")
        for _, shard in self.pool.put(task):
            self.shards.inc()
            yield shard

    def finish_bundle(self):
        if self.pool is not None:
            for _, shard in self.pool.drain():
                self.shards.inc()
                yield WindowedValue(shard, 0, [GlobalWindow()])
            count_lost(self.pool)  # a shard whose process died was written again, alone, from its chunks


class WriteShards(beam.PTransform):
    """(split, Example bytes) to shards with a controlled count; returns one dict per shard.

    Records are staged in per-bundle chunk files (spread order, an offset index); the plan
    gives each shard one byte range of each chunk in its group, and one worker writes each
    shard from those ranges, a block of megabytes per read, shuffled (temp file, then rename,
    as Beam's FileBasedSink does). Each staged byte is read once. Only chunk descriptors and
    ranges are grouped, so memory stays flat in the dataset size; see README 'Writing shards'.
    """

    def __init__(self, chunk_dir, shard_dir, num_shards, shard_size_mb, compression, write_index=False, schema_name="default", dropped_keys=None, processes=0,
                 filesystem_flags=(), prestaged=False):
        super().__init__()
        self.prestaged = prestaged  # the input is already chunks: (split, (chunk path, examples, bytes))
        self.processes = processes  # >1: shards written in the encode pool (DirectRunner)
        self.filesystem_flags = filesystem_flags  # for that pool's processes: S3's endpoint and keys
        self.chunk_dir, self.shard_dir = chunk_dir, shard_dir
        self.num_shards, self.shard_size_mb, self.compression = num_shards, shard_size_mb, compression
        self.write_index = write_index
        self.schema_name, self.dropped_keys = schema_name, dropped_keys  # dropped_keys: a PCollection of keys, or None

    def expand(self, examples):
        staged = examples
        if not self.prestaged:
            staged = examples | "Stage" >> beam.ParDo(_StageFn(self.chunk_dir, self.filesystem_flags))
            # (split, (chunk path, examples, bytes of records))
        split_bytes = staged | "Sizes" >> beam.MapTuple(lambda split, chunk: (split, chunk[2])) | "SumSizes" >> beam.CombinePerKey(sum)
        return (
            staged
            | "CountChunks" >> beam.ParDo(_CountShuffled())
            | "GroupChunks" >> beam.GroupByKey()
            | "Plan" >> beam.ParDo(_PlanFn(self.num_shards, self.shard_size_mb, self.chunk_dir, self.filesystem_flags),
                                   chunk_bytes=beam.pvalue.AsDict(split_bytes))
            # (split, shard index, shard count, [(chunk path, start byte, end byte, examples)])
            | "CountTasks" >> beam.ParDo(_CountShuffled())
            | "SpreadShards" >> beam.Reshuffle()
            | "Write"
            >> beam.ParDo(
                _WriteShardFn(self.shard_dir, self.compression, self.write_index, self.schema_name, self.processes, self.filesystem_flags),
                **_dropped_side_input(self.dropped_keys),
            )
        )


def _dropped_side_input(dropped_keys) -> dict:
    return {} if dropped_keys is None else {"dropped": beam.pvalue.AsList(dropped_keys)}


class DropKeys(beam.DoFn):
    """Drops the elements whose key is among the removed duplicates (--dedup), a side input of keys."""

    def __init__(self, key_fn):
        self.key_fn = key_fn
        self.dropped = None

    def process(self, element, dropped):
        if self.dropped is None:  # one global window, so one side input value: build the set once
            self.dropped = set(dropped)
        if not self.dropped or self.key_fn(element) not in self.dropped:
            yield element


def _record_key(schema_name, element):
    return records.key_of(element[1], schema_name)


class WriteRejects(beam.PTransform):
    """Reject rows to one JSON-lines file in the staging folder; returns its path."""

    def __init__(self, path):
        super().__init__()
        self.path = path

    def expand(self, rejects):
        import json

        return (
            rejects
            | "Json" >> beam.Map(lambda row: json.dumps(row, ensure_ascii=False, sort_keys=True))
            | "Write" >> beam.io.WriteToText(self.path, shard_name_template="", num_shards=1)
        )


class WriteLedger(beam.PTransform):
    """Facts of written records and reject rows to the ledger's gzipped JSON lines (ledger.py); returns their paths.

    Two writes, not one after a Flatten: a runner materialises a Flatten's inputs, so the
    written records' lines would be encoded, buffered and made after the encode ends (about 8 s
    of one core at 50k images, docs/BENCHMARKS.md §19). Unflattened, they are made and
    compressed as the records arrive, in the encode's own stage.
    """

    def __init__(self, folder, generation: int = 1):
        super().__init__()
        self.folder, self.generation = folder, generation

    def expand(self, pcolls):
        facts, rejects = pcolls
        written = (
            facts
            | "FromFacts" >> beam.Map(lambda f, g: ledger.dumps(ledger.from_facts(f, g)), self.generation)
            | "WriteWritten" >> beam.io.WriteToText(FileSystems.join(self.folder, ledger.PREFIX), file_name_suffix=ledger.SUFFIX)
        )
        rejected = (
            rejects
            | "FromRejects" >> beam.Map(lambda row, g: ledger.dumps(ledger.from_reject(row, g)), self.generation)
            | "WriteRejected" >> beam.io.WriteToText(FileSystems.join(self.folder, ledger.REJECTED_PREFIX), file_name_suffix=ledger.SUFFIX)
        )
        return (written, rejected) | "Files" >> beam.Flatten()  # a few paths


class _TrainingStatsFn(beam.CombineFn):
    """Facts of the training split to trainstats' summary: label counts and pixel means."""

    def __init__(self, channels: int):
        self.channels = channels

    def create_accumulator(self):
        return trainstats.empty(self.channels)

    def add_input(self, acc, facts):
        return trainstats.add(acc, facts.label_text, facts.pixel_mean, facts.pixel_sq_mean)

    def merge_accumulators(self, accs):
        return trainstats.merge(accs, self.channels)

    def extract_output(self, acc):
        return trainstats.finish(acc)


class SummarizeTraining(beam.PTransform):
    """Facts to one summary of the training split, for the transform graph written at publish."""

    def __init__(self, channels: int):
        super().__init__()
        self.channels = channels

    def expand(self, facts):
        return (
            facts
            | "Train" >> beam.Filter(lambda f: f.split == "train")
            | "Combine" >> beam.CombineGlobally(_TrainingStatsFn(self.channels))
            # one dict: trainstats.finish
        )


class _DescribeShardFn(beam.DoFn):
    """A shard file written by WriteToTFRecord to the dict _WriteShardFn would have emitted."""

    def __init__(self, compression, write_index=False):
        self.compression = compression
        self.write_index = write_index

    def process(self, path, split_counts):
        import posixpath
        import re

        name = posixpath.basename(path)
        split, index, count = re.match(r"^([a-z]+)-(\d{5})-of-(\d{5})\.", name).groups()
        if not split_counts.get(split):
            FileSystems.delete([path])  # a split with no records gets no empty shards
            return
        ctype = CompressionTypes.GZIP if self.compression == "gzip" else CompressionTypes.UNCOMPRESSED
        with FileSystems.open(path, compression_type=ctype) as f:
            examples = sum(1 for _ in tfrecord.iter_framed(f, path))
        nbytes, digest = sharding.file_digest(path)
        if self.write_index:
            from beam_etl.index import index_name, write_index

            write_index(path, FileSystems.join(posixpath.dirname(path), index_name(name)), check=False)
        yield {"split": split, "file": name, "index": int(index), "count": int(count), "examples": examples, "bytes": nbytes, "sha256": digest, "indexed": self.write_index}


class WriteShardsWithTFRecordIO(beam.PTransform):
    """(split, Example bytes) to shards with beam.io.WriteToTFRecord, for runners with a real shuffle.

    WriteToTFRecord groups the payloads themselves by shard: on Dataflow and Flink that is
    the runner's distributed shuffle; on the DirectRunner it holds the split in memory.
    Its shard count is fixed when the graph is built, so it needs --num_shards.
    """

    def __init__(self, shard_dir, num_shards, compression, schema_name="default", dropped_keys=None, write_index=False, splits=sources.SPLITS):
        super().__init__()
        self.shard_dir, self.num_shards, self.compression, self.splits = shard_dir, num_shards, compression, splits
        self.schema_name, self.dropped_keys, self.write_index = schema_name, dropped_keys, write_index

    def expand(self, examples):
        if self.dropped_keys is not None:
            examples = examples | "DropDuplicates" >> beam.ParDo(DropKeys(functools.partial(_record_key, self.schema_name)), dropped=beam.pvalue.AsList(self.dropped_keys))
        split_counts = examples | "SplitOf" >> beam.Map(lambda kv: kv[0]) | "CountSplits" >> beam.combiners.Count.PerElement()
        written = []
        for split in self.splits:
            count = self.num_shards if isinstance(self.num_shards, int) else self.num_shards.get(split, 1)
            written.append(
                examples
                | f"Only_{split}" >> beam.Filter(lambda kv, s=split: kv[0] == s)
                | f"Payload_{split}" >> beam.Map(lambda kv: kv[1])
                | f"CountPayloads_{split}" >> beam.ParDo(_CountShuffled())  # WriteToTFRecord groups each by shard
                | f"Write_{split}"
                >> beam.io.WriteToTFRecord(
                    FileSystems.join(self.shard_dir, split),
                    num_shards=count,
                    shard_name_template="-SSSSS-of-NNNNN",
                    file_name_suffix=sharding.suffix(self.compression),
                    compression_type=CompressionTypes.GZIP if self.compression == "gzip" else CompressionTypes.UNCOMPRESSED,
                )
            )
        return (
            written
            | "AllShards" >> beam.Flatten()
            # shard file paths
            | "Describe" >> beam.ParDo(_DescribeShardFn(self.compression, self.write_index), split_counts=beam.pvalue.AsDict(split_counts))
        )
