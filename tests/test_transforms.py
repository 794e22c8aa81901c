"""Each PTransform on the real DirectRunner, with TestPipeline and assert_that."""

import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to, is_not_empty

from beam_etl import images, records, schema, tfrecord
from beam_etl.images import Policy
from beam_etl.sources import ImageRef
from beam_etl.transforms import CHUNKS, REJECTS, EncodeExamples, ListImages, WriteShards
from tests import corpus


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "root"
    files = {
        "cat/1.jpg": corpus.jpeg(seed=1),
        "cat/sub/2.png": corpus.encode(corpus.photo(seed=2), "PNG"),
        "dog/3.jpg": corpus.jpeg(seed=3),
        "dog/.DS_Store": b"junk",
        "loose.jpg": corpus.jpeg(seed=4),
        "dog/broken.jpg": b"not an image",
    }
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


@pytest.mark.parametrize("spread", [True, False])
def test_list_images(folder, spread):
    with TestPipeline() as p:
        refs, fingerprint, count = p | "ListImages" >> ListImages([str(folder)], spread)
        keyed = refs | beam.Map(lambda r: (r.key, r.label, r.split, r.size > 0))
        assert_that(
            keyed,
            equal_to([("cat/1.jpg", "cat", "", True), ("cat/sub/2.png", "cat", "", True), ("dog/3.jpg", "dog", "", True), ("loose.jpg", "", "", True), ("dog/broken.jpg", "dog", "", True)]),
        )
        assert_that(fingerprint | beam.Map(len), equal_to([32]), label="FingerprintIsHex")
        assert_that(count, equal_to([5]), label="Counted")


@pytest.mark.parametrize("processes", [0, 2], ids=["inline", "pool"])
def test_encode_examples_routes_rejects(folder, processes):
    refs = [
        ImageRef("cat/1.jpg", str(folder / "cat/1.jpg"), "cat", "", -1),
        ImageRef("dog/3.jpg", str(folder / "dog/3.jpg"), "dog", "validation", -1),
        ImageRef("dog/broken.jpg", str(folder / "dog/broken.jpg"), "dog", "", -1),
        ImageRef("loose.jpg", str(folder / "loose.jpg"), "", "", -1),
        ImageRef("eel/x.jpg", str(folder / "cat/1.jpg"), "eel", "", -1),
        ImageRef("gone.jpg", str(folder / "gone.jpg"), "cat", "", -1),
    ]
    with TestPipeline() as p:
        out = p | beam.Create(refs) | "EncodeExamples" >> EncodeExamples(records.Settings(Policy(), {"cat": 0, "dog": 1}, "default", 0.0, 0.0, 10_000_000), processes)
        assert_that(out.records | "Splits" >> beam.Map(lambda kv: kv[0]), equal_to(["train", "validation"]), label="Records")
        assert_that(
            out[REJECTS] | beam.Map(lambda row: (row["key"], row["reason"])),
            equal_to([("dog/broken.jpg", images.NOT_AN_IMAGE), ("loose.jpg", images.NO_LABEL), ("eel/x.jpg", images.UNKNOWN_LABEL), ("gone.jpg", images.UNREADABLE)]),
            label="Rejects",
        )
        assert_that(out.facts | beam.Map(lambda f: (f.key, f.label)), equal_to([("cat/1.jpg", 0), ("dog/3.jpg", 1)]), label="Facts")


def test_the_pool_stages_the_records_and_write_shards_takes_its_chunks(folder, tmp_path):
    """With a chunk_dir, no Example crosses back from the pool: chunks do, and WriteShards(prestaged) reads them."""
    refs = [ImageRef(f"{label}/{i}.jpg", str(folder / path), label, "", -1)
            for i, (label, path) in enumerate([("cat", "cat/1.jpg"), ("dog", "dog/3.jpg"), ("dog", "dog/broken.jpg")] * 5)]
    settings = records.Settings(Policy(), {"cat": 0, "dog": 1}, "default", 0.0, 0.0, 10_000_000)
    expected = sorted(records.convert(r, settings)[1] for r in refs if "broken" not in r.uri)
    with TestPipeline() as p:
        out = p | beam.Create(refs) | "EncodeExamples" >> EncodeExamples(settings, 2, chunk_dir=str(tmp_path / "chunks"))
        assert_that(out.records, equal_to([]), label="NoPayloads")
        where = out[CHUNKS] | beam.MapTuple(lambda split, chunk: (split, chunk[0].startswith(str(tmp_path)))) | beam.Distinct()
        assert_that(where, equal_to([("train", True)]), label="ChunksInStaging")
        assert_that(out[REJECTS] | beam.Map(lambda row: row["reason"]), equal_to([images.NOT_AN_IMAGE] * 5), label="Rejects")
        shards = out[CHUNKS] | "WriteShards" >> WriteShards(str(tmp_path / "chunks"), str(tmp_path / "shards"), {"train": 2}, 256, "none",
                                                              prestaged=True)
        assert_that(shards | beam.Map(lambda s: (s["file"], s["examples"])),
                    equal_to([("train-00000-of-00002.tfrecord", 5), ("train-00001-of-00002.tfrecord", 5)]), label="Shards")
    written = []
    for path in sorted((tmp_path / "shards").glob("train-*")):
        with open(path, "rb") as f:
            written += [r for _, _, r in tfrecord.iter_framed(f, str(path))]
    assert sorted(written) == expected


@pytest.mark.parametrize("processes", [0, 2], ids=["inline", "pool"])
def test_write_shards(tmp_path, processes):
    examples = [("train", schema.encode_example({**dict.fromkeys(schema.ROLES, ""), "image": b"x" * i, "label": i, "height": 1, "width": 1, "channels": 3})) for i in range(40)]
    examples += [("validation", b"v%d" % i) for i in range(5)]
    with TestPipeline() as p:
        shards = p | beam.Create(examples) | "WriteShards" >> WriteShards(str(tmp_path / "chunks"), str(tmp_path / "shards"), {"train": 3}, 256, "none", processes=processes)
        assert_that(
            shards | beam.Map(lambda s: (s["file"], s["examples"])),
            equal_to([("train-00000-of-00003.tfrecord", 14), ("train-00001-of-00003.tfrecord", 13), ("train-00002-of-00003.tfrecord", 13), ("validation-00000-of-00001.tfrecord", 5)]),
        )
    written = []
    for path in sorted((tmp_path / "shards").glob("train-*")):
        with open(path, "rb") as f:
            written += [r for _, _, r in tfrecord.iter_framed(f, str(path))]
    assert sorted(written) == sorted(e for s, e in examples if s == "train")
    assert not list((tmp_path / "shards").glob(".*tmp"))  # temp names were all renamed


def test_write_shards_by_size(tmp_path):
    examples = [("train", b"y" * 100_000) for _ in range(30)]  # ~3 MB
    with TestPipeline() as p:
        shards = p | beam.Create(examples) | WriteShards(str(tmp_path / "c"), str(tmp_path / "s"), None, 1.0, "none")
        assert_that(shards | beam.Map(lambda s: s["count"]), equal_to([4] * 4))
        assert_that(shards, is_not_empty(), label="NotEmpty")


@pytest.mark.parametrize("processes,mode,shuffled", [(2, "in_memory", False), (0, "in_memory", True), (2, "multi_threading", True)])
def test_the_listing_is_shuffled_unless_the_pool_spreads_the_work(tmp_path, processes, mode, shuffled):
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_etl import pipeline

    config = pipeline.ConvertConfig(inputs=(str(tmp_path),), output=str(tmp_path / "out"), label_names=("cat",), policy=Policy(), encode_processes=processes)
    p = beam.Pipeline(options=PipelineOptions(["--direct_running_mode", mode]))
    pipeline.build(p, config)
    names = [t.unique_name for t in p.to_runner_api().components.transforms.values()]
    assert any(n.startswith("ListImages/BreakFusion") for n in names) == shuffled
    # The in_memory pool writes the chunks itself; any other topology stages in the Beam worker.
    assert any(n.startswith("WriteShards/Stage") for n in names) == shuffled
