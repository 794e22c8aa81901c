"""`convert --update`: the next version of a dataset, converting only what changed in its source.

The source is compared with the latest version's ledger (changes.py). New and changed keys
are converted; relabelled ones are rebuilt from their bytes and ledger line, without a decode
(records.relabel); unchanged ones are carried, unread. The new records are shards of a new
generation, in a folder of their own (v00002/...). No published file is rewritten: the new
version names the shards of every generation it uses and excludes, by (generation, key),
the old records that were changed, relabelled or removed. Version N's document stays in
versions/, dataset.json names the latest and is written last.
"""

import datetime
import shutil
import uuid

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from beam_etl import changes, ledger, metadata, objstore, progress, records, sources, trainstats
from beam_etl.images import Rejected
from beam_etl.transforms import REJECTS, EncodeExamples, WriteLedger, WriteRejects, WriteShards

ENCODE, RELABEL, EXCLUDE, CARRIED = "encode", "relabel", "exclude", "carried"
VERSIONS_DIR = metadata.VERSIONS_DIR


def version_of(document: dict) -> int:
    return int(document.get("version", 1))


def generation_dir(generation: int) -> str:
    return f"v{generation:05d}"


version_json = metadata.version_json


class NotUpdatable(ValueError):
    """The output holds no dataset that --update can build on; the message says what to do."""


def check_updatable(document: dict, output: str, label_names) -> None:
    """NotUpdatable unless the dataset has a ledger, no --dedup, and every label the inputs have."""
    if "ledger" not in document:
        raise NotUpdatable(f"{output} was converted before datasets had a ledger: convert it once more with --overwrite, then --update")
    if document["options"].get("dedup"):
        raise NotUpdatable(f"{output} was converted with --dedup, which --update does not do yet: convert with --overwrite")
    new = sorted(set(label_names) - set(document["label_names"]))
    if new:
        raise NotUpdatable(f"the inputs have labels {new} that {output} lacks (its labels are {document['label_names']}); "
                           "label ids are fixed for a dataset's versions: convert with --overwrite to add labels")


class _PlanFn(changes._CompareFn):
    """A bucket of (listing, ledger lines) to what the update does with each key (tagged outputs).

    main: (verdict, key) of each key not unchanged; ENCODE: ImageRef; RELABEL: (ImageRef, line); EXCLUDE: (generation, key,
    split) of an old record the version drops; CARRIED: one dict per bucket, with the carried
    lines written to the staging folder and their counts and statistics.
    """

    def __init__(self, fractions, max_file_bytes, filesystem_flags, folder, channels, buckets):
        super().__init__(*fractions, max_file_bytes, filesystem_flags)
        self.folder, self.channels, self.buckets = folder, channels, buckets

    def process(self, element):
        bucket, grouped = element
        old = {entry["key"]: entry for batch in grouped["old"] for entry in map(ledger.loads, batch)}
        carried, listed, fingerprint, work = [], 0, 0, False
        for batch in grouped["listed"]:
            for ref in map(sources.ImageRef._make, batch):
                listed += 1
                fingerprint = (fingerprint + sources.fingerprint_entry(ref.uri, ref.size, ref.mtime)) % (1 << 128)
                entry = old.pop(ref.key, None)
                split = ref.split or sources.assign_split(ref.key, *self.fractions)
                verdict = ledger.compare(ref, entry, split)
                if verdict == ledger.CHECK:
                    verdict = self._check(ref, entry, split)
                self.counters[verdict].inc()
                if verdict != ledger.UNCHANGED:  # the few: unchanged keys are counted in CARRIED
                    yield verdict, ref.key
                if verdict in (ledger.UNCHANGED, ledger.TOUCHED):
                    carried.append(dict(entry, size=ref.size, mtime=ref.mtime))
                    continue
                work = True
                if entry is not None and entry["outcome"] == ledger.WRITTEN:
                    yield beam.pvalue.TaggedOutput(EXCLUDE, (entry.get("generation", 1), ref.key, entry["split"]))
                if verdict == ledger.RELABELLED:
                    yield beam.pvalue.TaggedOutput(RELABEL, (ref, entry))
                else:
                    yield beam.pvalue.TaggedOutput(ENCODE, ref)
        for entry in old.values():  # removed from the source
            work = True
            self.counters[ledger.REMOVED].inc()
            yield ledger.REMOVED, entry["key"]
            if entry["outcome"] == ledger.WRITTEN:
                yield beam.pvalue.TaggedOutput(EXCLUDE, (entry.get("generation", 1), entry["key"], entry["split"]))
        # With one bucket and no change in it there is no version to write, so no lines either.
        yield beam.pvalue.TaggedOutput(CARRIED, self._carry(bucket, carried, listed, fingerprint, write=work or self.buckets > 1))

    def _carry(self, bucket: int, carried: list, listed: int, fingerprint: int, write: bool = True) -> dict:
        """Write the carried lines (a retry writes the same file) and describe them."""
        acc, labels, rejects = trainstats.empty(self.channels), {}, {}
        for entry in carried:
            if entry["outcome"] != ledger.WRITTEN:
                rejects[entry["outcome"]] = rejects.get(entry["outcome"], 0) + 1
                continue
            labels[(entry["split"], entry["label"])] = labels.get((entry["split"], entry["label"]), 0) + 1
            if entry["split"] == "train":
                trainstats.add(acc, entry["label"], entry["pixel_mean"], entry["pixel_sq_mean"])
        name = f"carried-{bucket:05d}{ledger.SUFFIX}"
        if write:
            path = FileSystems.join(self.folder, name)
            temp = f"{path}.{uuid.uuid4().hex}.tmp"
            with FileSystems.create(temp, compression_type=CompressionTypes.GZIP) as f:
                f.write("".join(ledger.dumps(e) + "\n" for e in carried).encode("utf-8"))
            FileSystems.rename([temp], [path])
        return {"file": name, "entries": len(carried), "listed": listed, "fingerprint": fingerprint, "acc": acc,
                "labels": sorted((split, label, n) for (split, label), n in labels.items()), "rejects": rejects}


class _RelabelFn(beam.DoFn):
    """(ImageRef, line) to its rebuilt record (split, Example) and Facts, or the ref to convert as usual."""

    def __init__(self, settings):
        self.settings = settings

    def process(self, element):
        ref, entry = element
        try:
            data = records.fetch(ref, self.settings)
            record = records.relabel(ref, data, entry, self.settings)
        except Rejected:  # converting it gives the reject, with its reason
            record = None
        if record is None:
            yield beam.pvalue.TaggedOutput(ENCODE, ref)
            return
        Metrics.counter(progress.NAMESPACE, "images_relabelled").inc()
        split, example, facts = record
        yield beam.pvalue.TaggedOutput("facts", facts)
        yield split, example


def build(p: beam.Pipeline, config, document: dict, settings, run_id: str = "") -> str:
    """Wire the update of the dataset in config.output (its latest `document`) into `p`; returns the staging folder."""
    output = config.output
    staging = FileSystems.join(output, f".staging-{run_id or uuid.uuid4().hex[:12]}")
    generation = version_of(document) + 1
    options = document["options"]
    buckets = changes.bucket_count(document["ledger"]["entries"])
    files = [FileSystems.join(output, name) for name in document["ledger"]["files"]]
    ledger_dir = FileSystems.join(staging, ledger.LEDGER_DIR)
    listed = p | "Inputs" >> beam.Create(list(config.inputs)) | "List" >> beam.ParDo(changes._ListBatchesFn(config.inputs, buckets, config.filesystem_flags))
    old = p | "LedgerFiles" >> beam.Create(files) | "ReadLedger" >> beam.ParDo(changes._ReadLedgerFn(buckets, config.filesystem_flags))
    fractions = (options.get("validation_fraction", 0.0), options.get("test_fraction", 0.0))
    planned = (
        {"listed": listed, "old": old}
        | "Join" >> beam.CoGroupByKey()
        | "Plan" >> beam.ParDo(_PlanFn(fractions, settings.max_file_bytes, config.filesystem_flags, ledger_dir, config.policy.channels, buckets))
        .with_outputs(ENCODE, RELABEL, EXCLUDE, CARRIED, main="verdicts")
    )
    relabelled = planned[RELABEL] | "Relabel" >> beam.ParDo(_RelabelFn(settings)).with_outputs(ENCODE, "facts", main="records")
    refs = (planned[ENCODE], relabelled[ENCODE]) | "ToEncode" >> beam.Flatten()
    encoded = refs | "EncodeExamples" >> EncodeExamples(settings, config.encode_processes)
    examples = (encoded.records, relabelled.records) | "AllRecords" >> beam.Flatten()
    facts = (encoded.facts, relabelled.facts) | "AllFacts" >> beam.Flatten()
    shards = examples | "WriteShards" >> WriteShards(
        FileSystems.join(staging, "chunks"), FileSystems.join(staging, "shards"), None, config.shard_size_mb, config.compression,
        config.write_index, config.schema, None, config.encode_processes, config.filesystem_flags,
    )
    rejects = encoded[REJECTS]
    rejects_written = rejects | "WriteRejects" >> WriteRejects(FileSystems.join(staging, metadata.REJECTED_JSONL))
    new_lines = (facts, rejects) | "WriteLedger" >> WriteLedger(ledger_dir, generation)
    new_facts = facts | "FactsSummary" >> beam.Map(lambda f: (f.split, f.label_text, f.pixel_mean, f.pixel_sq_mean) if f.split == "train" else (f.split, f.label_text, None, None))
    reject_rows = rejects | "RejectReason" >> beam.Map(lambda row: row["reason"])
    _ = (
        p
        | "Once" >> beam.Create([None])
        | "Publish"
        >> beam.ParDo(
            _PublishVersionFn(config, document, staging, generation),
            shards=beam.pvalue.AsList(shards),
            verdicts=beam.pvalue.AsList(planned["verdicts"]),
            excluded=beam.pvalue.AsList(planned[EXCLUDE]),
            carried=beam.pvalue.AsList(planned[CARRIED]),
            new_facts=beam.pvalue.AsList(new_facts),
            new_rejects=beam.pvalue.AsList(reject_rows),
            new_lines=beam.pvalue.AsList(new_lines),
            rejects_done=beam.pvalue.AsList(rejects_written),
        )
    )
    return staging


class _PublishVersionFn(beam.DoFn):
    """Runs once, after everything else: reconciles the counts, writes the graph, publishes version N+1 atomically."""

    def __init__(self, config, document, staging, generation):
        self.config, self.document, self.staging, self.generation = config, document, staging, generation

    def setup(self):
        objstore.configure(self.config.filesystem_flags, [self.config.output])

    def process(self, _, shards, verdicts, excluded, carried, new_facts, new_rejects, new_lines, rejects_done):
        keyed = dict((key, verdict) for verdict, key in verdicts)  # every key that is not unchanged
        verdicts = {v: 0 for v in ledger.VERDICTS}
        for verdict in keyed.values():
            verdicts[verdict] += 1
        listed = sum(c["listed"] for c in carried)
        carried_count = sum(c["entries"] for c in carried)
        verdicts[ledger.UNCHANGED] = carried_count - verdicts[ledger.TOUCHED]
        work = sum(verdicts[v] for v in (ledger.NEW, ledger.CHANGED, ledger.RELABELLED, ledger.REMOVED))
        written, rejected = len(new_facts), len(new_rejects)
        if written + rejected + carried_count != listed:
            raise metadata.IncompleteDataset(f"{listed} inputs but {written} written + {rejected} rejected + {carried_count} unchanged: records were lost or duplicated")
        if not work:  # nothing to publish: the staging folder goes, the dataset stays as it is
            objstore.delete_tree(self.staging)
            yield {"published": False, "verdicts": verdicts, "listed": listed}
            return
        document = self._document(shards, verdicts, excluded, carried, new_facts, new_rejects, new_lines, listed)
        self._merge_rejects(set(keyed))
        self.work = None
        try:
            publish_version(self.staging, self.config.output, self.document, document, self._analysis(carried, new_facts))
        finally:
            if self.work:  # the graph built here, not by the helper: a local folder of this step's own
                shutil.rmtree(self.work, ignore_errors=True)
        objstore.delete_tree(self.staging)
        metadata.remove_stale_staging(self.config.output)
        yield {"published": True, "verdicts": verdicts, "listed": listed, "version": self.generation}

    def _merge_rejects(self, touched_keys: set) -> None:
        """The version's rejected.jsonl: the last version's rows of keys that did not change, and this run's."""
        import json

        rows = []
        old, new = FileSystems.join(self.config.output, metadata.REJECTED_JSONL), FileSystems.join(self.staging, metadata.REJECTED_JSONL)
        for path, keep in ((old, lambda row: row["key"] not in touched_keys), (new, lambda row: True)):
            if FileSystems.exists(path):
                with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
                    rows += [line for line in f.read().decode("utf-8").splitlines() if line.strip() and keep(json.loads(line))]
        temp = f"{new}.{uuid.uuid4().hex}.tmp"
        with FileSystems.create(temp, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            f.write("".join(row + "\n" for row in rows).encode("utf-8"))
        if FileSystems.exists(new):
            FileSystems.delete([new])
        FileSystems.rename([temp], [new])

    def _summary(self, carried, new_facts) -> dict:
        channels = self.config.policy.channels
        acc = trainstats.merge([c["acc"] for c in carried], channels)
        for split, label, mean, sq_mean in new_facts:
            if split == "train":
                trainstats.add(acc, label, mean, sq_mean)
        return trainstats.finish(acc)

    def _analysis(self, carried, new_facts):
        """(the graph's local folder, its statistics) for the whole version: from the ledger's facts, no decode."""
        import tempfile

        from beam_etl import analyze, transform_helper

        summary, labels, channels = self._summary(carried, new_facts), self.document["label_names"], self.config.policy.channels
        built = transform_helper.hand_over(*self.config.transform_helper, labels, channels, summary) if self.config.transform_helper else None
        if built is None:  # no helper (Flink, Dataflow), or it failed: TensorFlow's import, here
            self.work = tempfile.mkdtemp(prefix="beam-etl-analysis-")
            built = analyze.build(self.work, labels, channels, summary)
        return built

    def _document(self, shards, verdicts, excluded, carried, new_facts, new_rejects, new_lines, listed) -> dict:
        import posixpath

        previous, generation = self.document, self.generation
        folder = generation_dir(generation)
        labels = {}
        for c in carried:
            for split, label, n in c["labels"]:
                labels[(split, label)] = labels.get((split, label), 0) + n
        for split, label, _, _ in new_facts:
            labels[(split, label)] = labels.get((split, label), 0) + 1
        rejects = {}
        for c in carried:
            for reason, n in c["rejects"].items():
                rejects[reason] = rejects.get(reason, 0) + n
        for reason in new_rejects:
            rejects[reason] = rejects.get(reason, 0) + 1
        dropped = [list(e) for e in previous.get("excluded", {}).get("records", [])] + sorted([g, key] for g, key, _ in excluded)
        by_split = dict(previous.get("excluded", {}).get("by_split", {}))
        for _, _, split in excluded:
            by_split[split] = by_split.get(split, 0) + 1
        splits = {}
        for name, info in previous["splits"].items():
            splits[name] = {"shards": [dict(s, generation=s.get("generation", 1)) for s in info["shards"]]}
        for info in sorted(shards, key=lambda s: (s["split"], s["index"])):
            entry = {"file": f"{folder}/{info['file']}", "examples": info["examples"], "bytes": info["bytes"], "sha256": info["sha256"], "generation": generation}
            if info.get("indexed"):  # --write_index: a DALI index beside it
                entry["index"] = True
            splits.setdefault(info["split"], {"shards": []})["shards"].append(entry)
        for name, split in splits.items():
            split["examples"] = sum(n for (s, _), n in labels.items() if s == name)
            split["bytes"] = sum(s["bytes"] for s in split["shards"])
            split["label_counts"] = {label: n for (s, label), n in sorted(labels.items()) if s == name}
            physical = sum(s["examples"] for s in split["shards"])
            if physical - by_split.get(name, 0) != split["examples"]:
                raise metadata.IncompleteDataset(f"split {name}: {physical} records in shards less {by_split.get(name, 0)} excluded is not {split['examples']}")
        fingerprint = sum(c["fingerprint"] for c in carried) % (1 << 128)
        carried_files = [f"{ledger.LEDGER_DIR}/{folder}/{c['file']}" for c in carried]
        new_files = [f"{ledger.LEDGER_DIR}/{folder}/{posixpath.basename(p)}" for p in new_lines]
        document = dict(previous)
        document.update(
            version=generation,
            created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            splits=splits,
            rejected={"total": sum(rejects.values()), "by_reason": dict(sorted(rejects.items())), "file": metadata.REJECTED_JSONL},
            inputs=listed,
            source_fingerprint=f"{fingerprint:032x}",
            ledger={"entries": listed, "files": sorted(carried_files + new_files)},
            excluded={"total": len(dropped), "by_split": dict(sorted(by_split.items())), "records": dropped},
            update={"from_version": version_of(previous), **{v: verdicts.get(v, 0) for v in ledger.VERDICTS}},
            versions=metadata.versions(),
        )
        return document


def publish_version(staging: str, output: str, previous: dict, document: dict, analysis) -> None:
    """Move version N+1's files in beside version N's, keep N's document and graph, and write dataset.json last."""
    import os

    folder, work = generation_dir(document["version"]), analysis[0]
    document["statistics"] = analysis[1]
    old_version = version_of(previous)
    kept = FileSystems.join(output, version_json(old_version))
    if not FileSystems.exists(kept):  # version N's own record, before anything of N+1 is visible
        metadata.write_json(kept, previous)
        rejected = FileSystems.join(output, metadata.REJECTED_JSONL)
        if FileSystems.exists(rejected):
            objstore.copy_file(rejected, FileSystems.join(output, VERSIONS_DIR, generation_dir(old_version), metadata.REJECTED_JSONL))
        for name in metadata.TRANSFORM_DIRS:
            for path in metadata._files_under(FileSystems.join(output, name)):
                rel = path[len(FileSystems.join(output, name)) + 1:]
                objstore.copy_file(path, FileSystems.join(output, VERSIONS_DIR, generation_dir(old_version), name, rel))
    for split in document["splits"].values():
        for shard in split["shards"]:
            if shard["generation"] == document["version"]:
                for suffix in ("", ".idx") if shard.get("index") else ("",):
                    staged = FileSystems.join(staging, "shards", shard["file"].split("/", 1)[1] + suffix)
                    metadata._move(staged, FileSystems.join(output, shard["file"] + suffix))
    for name in document["ledger"]["files"]:
        if name.startswith(f"{ledger.LEDGER_DIR}/{folder}/"):
            metadata._move(FileSystems.join(staging, ledger.LEDGER_DIR, name.rsplit("/", 1)[1]), FileSystems.join(output, name))
    for name in metadata.TRANSFORM_DIRS:  # the new graph: in versions/, and in place for the latest
        base = os.path.join(work, name)
        for root, _, names in os.walk(base):
            for file in names:
                path = os.path.join(root, file)
                rel = os.path.relpath(path, base).split(os.sep)
                objstore.copy_file(path, FileSystems.join(output, VERSIONS_DIR, folder, name, *rel))
    metadata.write_json(FileSystems.join(output, version_json(document["version"])), document)
    current = metadata.read(output)
    if version_of(current) != version_of(previous):  # another update published first
        raise ConcurrentUpdate(f"{output} moved to version {version_of(current)} while this update built version {document['version']} "
                               f"from version {version_of(previous)}: run --update again")
    old = []
    for name in metadata.TRANSFORM_DIRS:
        old += metadata._files_under(FileSystems.join(output, name))
    if old:
        FileSystems.delete(old)
    for name in metadata.TRANSFORM_DIRS:
        for path in metadata._files_under(FileSystems.join(output, VERSIONS_DIR, folder, name)):
            rel = path[len(FileSystems.join(output, VERSIONS_DIR, folder, name)) + 1:]
            objstore.copy_file(path, FileSystems.join(output, name, rel))
    metadata.move_rejects(staging, output)
    metadata.write_json(FileSystems.join(output, metadata.DATASET_JSON), document)


class ConcurrentUpdate(RuntimeError):
    """Another update published a version first."""
