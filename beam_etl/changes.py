"""Compare a source with a dataset's ledger: which keys are new, changed, relabelled, removed.

Wires ledger.py's pure comparison to Beam: the source's listing and the ledger's lines are
joined by key; only a key whose listed size or mtime differs from its line is read, and
hashed. The verdicts are Beam counters (changes_<verdict>), plus changes_read for the reads.
"""

import hashlib

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from beam_etl import ledger, metadata, objstore, progress, sources
from beam_etl.images import Rejected
from beam_etl.transforms import _ListFn

READ = "changes_read"


def counter_name(verdict: str) -> str:
    return f"changes_{verdict}"


class _CompareFn(beam.DoFn):
    """(key, {"listed": [ImageRef], "old": [ledger line]}) to (verdict, key), reading only what it must."""

    def __init__(self, validation_fraction, test_fraction, max_file_bytes, filesystem_flags=()):
        self.fractions = (validation_fraction, test_fraction)
        self.max_file_bytes, self.filesystem_flags = max_file_bytes, tuple(filesystem_flags)

    def setup(self):
        self.counters = {v: Metrics.counter(progress.NAMESPACE, counter_name(v)) for v in ledger.VERDICTS}
        self.read = Metrics.counter(progress.NAMESPACE, READ)

    def process(self, element):
        key, grouped = element
        listed, old = list(grouped["listed"]), list(grouped["old"])
        ref, entry = (listed[0] if listed else None), (old[0] if old else None)
        split = (ref.split or sources.assign_split(key, *self.fractions)) if ref else None
        verdict = ledger.compare(ref, entry, split)
        if verdict == ledger.CHECK:
            verdict = self._check(ref, entry, split)
        self.counters[verdict].inc()
        yield verdict, key

    def _check(self, ref, entry, split) -> str:
        objstore.configure_for(ref.uri, self.filesystem_flags)
        self.read.inc()
        try:
            data = sources.read_bytes(ref, self.max_file_bytes)
        except Rejected:  # unreadable now: converting it again gives its reject
            return ledger.CHANGED
        return ledger.after_read(ref, entry, split, hashlib.sha256(data).hexdigest())


class CompareWithLedger(beam.PTransform):
    """The inputs and a dataset's ledger to (verdict, key) for every key of either."""

    def __init__(self, uris, data_dir, document, filesystem_flags=()):
        super().__init__()
        self.uris, self.data_dir, self.document = list(uris), data_dir, document
        self.filesystem_flags = tuple(filesystem_flags)

    def expand(self, pbegin):
        options = self.document.get("options", {})
        files = [FileSystems.join(self.data_dir, name) for name in self.document["ledger"]["files"]]
        listed = (
            pbegin
            | "Inputs" >> beam.Create(self.uris)
            | "List" >> beam.ParDo(_ListFn(self.uris, self.filesystem_flags))
            | "ListedByKey" >> beam.MapTuple(lambda ref, _: (ref.key, ref))
        )
        old = (
            pbegin
            | "LedgerFiles" >> beam.Create(files)
            | "ReadLedger" >> beam.io.ReadAllFromText()
            | "OldByKey" >> beam.Map(lambda line: (lambda entry: (entry["key"], entry))(ledger.loads(line)))
        )
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
