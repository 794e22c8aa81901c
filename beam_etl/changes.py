"""Compare a source with a dataset's ledger: which keys are new, changed, relabelled, removed.

Wires ledger.py's pure comparison to Beam: the source's listing and the ledger's lines are
joined by key; only a key whose listed size or mtime differs from its line is read, and
hashed. The verdicts are Beam counters (changes_<verdict>), plus changes_read for the reads.
"""

import hashlib

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from beam_etl import ledger, metadata, objstore, progress, sources
from beam_etl.images import Rejected
from beam_etl.transforms import _ListFn

READ = "changes_read"


def counter_name(verdict: str) -> str:
    return f"changes_{verdict}"


KEYS_PER_BUCKET = 100_000  # keys joined in one dict: ~100 MB of references and lines
BATCH = 2_000  # references or lines per element: Beam's cost per element, paid 2,000 times less


def bucket_count(entries: int) -> int:
    return max(1, -(-entries // KEYS_PER_BUCKET))


def bucket_of(key: str, buckets: int) -> int:
    """A key's bucket, the same in every process (str hash is salted per process)."""
    if buckets == 1:
        return 0
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "big") % buckets


def _batched(pairs, buckets: int):
    """(bucket, [items]) batches of at most BATCH from (key, item) pairs."""
    held = {}
    for key, item in pairs:
        bucket = bucket_of(key, buckets)
        batch = held.setdefault(bucket, [])
        batch.append(item)
        if len(batch) >= BATCH:
            yield bucket, held.pop(bucket)
    yield from held.items()


class _ListBatchesFn(_ListFn):
    """One --input to (bucket, [ImageRef as a plain tuple]) batches: Beam's coder packs those natively."""

    def __init__(self, uris, buckets, filesystem_flags=()):
        super().__init__(uris, filesystem_flags)
        self.buckets = buckets

    def process(self, uri):
        yield from _batched(((ref.key, tuple(ref)) for ref, _ in sources.listing(uri)), self.buckets)


class _ReadLedgerFn(beam.DoFn):
    """One ledger file to (bucket, [line as text]) batches: text is what Beam's coder moves fastest."""

    def __init__(self, buckets, filesystem_flags=()):
        self.buckets, self.filesystem_flags = buckets, tuple(filesystem_flags)

    def process(self, path):
        objstore.configure_for(path, self.filesystem_flags)
        import gzip

        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as raw, gzip.open(raw, "rt", encoding="utf-8") as lines:
            # Python's gzip, not Beam's line reader: 5x faster. One bucket needs no key, so no parse here.
            keyed = ((ledger.loads(line)["key"] if self.buckets > 1 else "", line) for line in lines)
            yield from _batched(keyed, self.buckets)


class _CompareFn(beam.DoFn):
    """(bucket, {"listed": [[ImageRef]], "old": [[line]]}) to (verdict, key) for each key not unchanged.

    Reads only a key whose listing differs from its line; counts every verdict.
    """

    def __init__(self, validation_fraction, test_fraction, max_file_bytes, filesystem_flags=()):
        self.fractions = (validation_fraction, test_fraction)
        self.max_file_bytes, self.filesystem_flags = max_file_bytes, tuple(filesystem_flags)

    def setup(self):
        self.counters = {v: Metrics.counter(progress.NAMESPACE, counter_name(v)) for v in ledger.VERDICTS}
        self.read = Metrics.counter(progress.NAMESPACE, READ)

    def process(self, element):
        _, grouped = element
        old = {entry["key"]: entry for batch in grouped["old"] for entry in map(ledger.loads, batch)}
        counts = dict.fromkeys(ledger.VERDICTS, 0)
        for batch in grouped["listed"]:
            for ref in map(sources.ImageRef._make, batch):
                entry = old.pop(ref.key, None)
                split = ref.split or sources.assign_split(ref.key, *self.fractions)
                verdict = ledger.compare(ref, entry, split)
                if verdict == ledger.CHECK:
                    verdict = self._check(ref, entry, split)
                counts[verdict] += 1
                if verdict != ledger.UNCHANGED:
                    yield verdict, ref.key
        counts[ledger.REMOVED] += len(old)
        for key in old:
            yield ledger.REMOVED, key
        for verdict, n in counts.items():
            self.counters[verdict].inc(n)

    def _check(self, ref, entry, split) -> str:
        objstore.configure_for(ref.uri, self.filesystem_flags)
        self.read.inc()
        try:
            data = sources.read_bytes(ref, self.max_file_bytes)
        except Rejected:  # unreadable now: converting it again gives its reject
            return ledger.CHANGED
        return ledger.after_read(ref, entry, split, hashlib.sha256(data).hexdigest())


class CompareWithLedger(beam.PTransform):
    """The inputs and a dataset's ledger to (verdict, key) for every key that is not unchanged.

    Both sides are dealt into buckets by a hash of the key, in batches, and joined a bucket
    at a time: Beam handles a few elements per 2,000 keys, not one per key.
    """

    def __init__(self, uris, data_dir, document, filesystem_flags=()):
        super().__init__()
        self.uris, self.data_dir, self.document = list(uris), data_dir, document
        self.filesystem_flags = tuple(filesystem_flags)

    def expand(self, pbegin):
        options = self.document.get("options", {})
        files = [FileSystems.join(self.data_dir, name) for name in self.document["ledger"]["files"]]
        buckets = bucket_count(self.document["ledger"]["entries"])
        listed = pbegin | "Inputs" >> beam.Create(self.uris) | "List" >> beam.ParDo(_ListBatchesFn(self.uris, buckets, self.filesystem_flags))
        old = pbegin | "LedgerFiles" >> beam.Create(files) | "ReadLedger" >> beam.ParDo(_ReadLedgerFn(buckets, self.filesystem_flags))
        return (
            {"listed": listed, "old": old}
            | "Join" >> beam.CoGroupByKey()
            | "Compare" >> beam.ParDo(_CompareFn(options.get("validation_fraction", 0.0), options.get("test_fraction", 0.0),
                                                 int(options.get("max_file_mb", 64.0) * 1e6), self.filesystem_flags))
        )


class NoLedger(ValueError):
    """The dataset predates the ledger, or is not a dataset."""


def run(uris, data_dir: str, beam_args=()) -> tuple:
    """({verdict: count}, images read) for the inputs against the dataset in data_dir."""
    from apache_beam.options.pipeline_options import PipelineOptions

    if not metadata.is_complete(data_dir):
        raise NoLedger(f"{data_dir} has no dataset.json: convert into it first (beam-etl convert --input ... --output {data_dir})")
    document = metadata.read(data_dir)
    if "ledger" not in document:
        raise NoLedger(f"{data_dir} was converted before datasets had a ledger: convert it again once (--overwrite) to compare later sources with it")
    p = beam.Pipeline(options=PipelineOptions(list(beam_args)))
    _ = p | "Compare" >> CompareWithLedger(uris, data_dir, document, beam_args)
    result = p.run()
    result.wait_until_finish()
    counts = {v: progress.counter_total(result, counter_name(v)) for v in ledger.VERDICTS}
    return counts, progress.counter_total(result, READ)
