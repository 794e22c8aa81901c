"""trainer.dataset, trainer.preprocess and trainer.input on datasets made by the real converter."""

import collections
import io
import json
import posixpath

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from tests.conftest import run_convert
from trainer import preprocess
from trainer.dataset import DatasetError, DatasetInfo
from trainer.input import InputError, make_dataset, worker_files

COLORS = {"red": (200, 30, 30), "green": (30, 180, 40), "blue": (20, 40, 210)}


@pytest.fixture(scope="module")
def color_dataset(tmp_path_factory):
    """RGB images of several sizes, half JPEG and half PNG, converted with the imagenet schema and GZIP.

    --image_format png keeps JPEG inputs as JPEG (passthrough) and stores the PNGs as PNG, so
    the records mix both formats, as real datasets can.
    """
    root = tmp_path_factory.mktemp("color")
    rng = np.random.default_rng(7)
    for label, rgb in COLORS.items():
        (root / "images" / label).mkdir(parents=True)
        for i in range(24):
            h, w = (int(v) for v in rng.integers(36, 120, 2))
            pixels = np.clip(np.array(rgb) + rng.normal(0, 20, (h, w, 3)), 0, 255).astype(np.uint8)
            fmt = "JPEG" if i % 2 else "PNG"
            Image.fromarray(pixels).save(root / "images" / label / f"{i:03d}.{fmt.lower()}", fmt)
    out = root / "ds"
    run_convert(
        "--input", root / "images", "--output", out, "--schema", "imagenet", "--compression", "gzip", "--channels", "3",
        "--image_format", "png", "--validation_fraction", "0.25", "--num_shards", "train=3,validation=2",
    )
    return out


def raw_records(info: DatasetInfo, split: str, roles=("image", "label", "label_text", "format", "key")) -> dict:
    """Every record of a split, parsed by role, in file order (the test's own reader)."""
    spec = {info.name(r): tf.io.FixedLenFeature([], tf.int64 if r == "label" else tf.string) for r in roles}
    ds = tf.data.TFRecordDataset(info.shard_paths(split), compression_type=info.compression)
    parsed = [tf.io.parse_single_example(r, spec) for r in ds]
    return {role: [p[info.name(role)].numpy() for p in parsed] for role in roles}


@pytest.fixture(scope="module", params=["mnist", "color"])
def info(request, mnist_dataset, color_dataset):
    return DatasetInfo.load(str(mnist_dataset if request.param == "mnist" else color_dataset))


def test_contract_is_read_from_dataset_json_and_tft(info):
    meta = json.load(open(posixpath.join(info.data_dir, "dataset.json")))
    assert info.label_names == tuple(meta["label_names"])
    assert info.channels == meta["channels"]
    assert info.compression == meta["tfrecord_compression"]
    assert info.parse_spec().keys() == {meta["features"][r]["name"] for r in ("image", "label", "format")}
    # TFT's analyser constants agree with the copy the converter wrote for people.
    np.testing.assert_allclose(info.channel_mean, meta["statistics"]["pixel_mean"], rtol=1e-3)
    np.testing.assert_allclose(info.channel_std, meta["statistics"]["pixel_std"], rtol=1e-3)
    assert all(tf.io.gfile.exists(p) for p in info.shard_paths("train"))


def test_both_schemas_and_gzip_are_read(mnist_dataset, color_dataset):
    mnist, color = DatasetInfo.load(str(mnist_dataset)), DatasetInfo.load(str(color_dataset))
    assert mnist.name("image") != color.name("image")  # the trainer followed dataset.json, not a constant
    assert color.compression == "GZIP" and all(p.endswith(".gz") for p in color.shard_paths("train"))
    images, labels = next(iter(make_dataset(color, "train", 8, training=True, image_size=40, seed=1)))
    assert images.shape == (8, 40, 40, 3) and labels.shape == (8,)


def test_missing_dataset_json_names_the_path(tmp_path):
    with pytest.raises(DatasetError, match="dataset.json not found"):
        DatasetInfo.load(str(tmp_path))


def test_unknown_split_names_the_splits(info):
    with pytest.raises(DatasetError, match="no split 'bogus'.*train"):
        info.shard_paths("bogus")


def test_labels_round_trip_to_label_names(info):
    records = raw_records(info, "train")
    for label, text, key in zip(records["label"], records["label_text"], records["key"]):
        assert info.label_names[label] == text.decode()
        assert key.decode().split("/")[0] == text.decode()  # the folder the image came from


def test_eval_labels_match_split_counts(info):
    meta = json.load(open(posixpath.join(info.data_dir, "dataset.json")))
    counts = collections.Counter()
    for _, labels in make_dataset(info, "validation", 32, training=False, image_size=32):
        counts.update(info.label_names[i] for i in labels.numpy())
    assert sum(counts.values()) == info.examples("validation")
    assert dict(counts) == {k: v for k, v in meta["splits"]["validation"]["label_counts"].items() if v}


@pytest.mark.parametrize("training", [True, False])
def test_batch_shapes_dtypes_and_ranges(info, training):
    size, batch = 32, 16
    ds = make_dataset(info, "train", batch, training=training, image_size=size, seed=3)
    low = (0 - info.channel_mean) / info.channel_std
    high = (255 - info.channel_mean) / info.channel_std
    for images, labels in ds.take(3):
        assert images.dtype == tf.float32 and labels.dtype == tf.int64
        assert images.shape == (batch, size, size, info.channels) and labels.shape == (batch,)
        x = images.numpy()
        assert np.isfinite(x).all()
        assert (x >= low - 1e-4).all() and (x <= high + 1e-4).all()
        assert x.std() > 0.1  # real pixels, not a constant
        assert ((labels.numpy() >= 0) & (labels.numpy() < len(info.label_names))).all()


def test_eval_dataset_is_repeatable(info):
    def arrays():
        return [x.numpy() for x, _ in make_dataset(info, "validation", 16, training=False, image_size=24)]

    first, second = arrays(), arrays()
    assert len(first) == len(second)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)


def _maps(info, size):
    """Each map function with fixed arguments, as a function of (encoded, format, seed)."""
    mean, std = info.channel_mean, info.channel_std
    c = info.channels
    return {
        "train_image": lambda e, f, s: preprocess.train_image(e, f, s, image_size=size, channels=c),
        "train_image_sniffed": lambda e, f, s: preprocess.train_image(e, None, s, image_size=size, channels=c),
        "eval_image": lambda e, f, s: preprocess.eval_image(e, image_size=size, channels=c),
        "decode": lambda e, f, s: tf.cast(preprocess.decode(e, c), tf.float32),
        "normalize": lambda e, f, s: preprocess.normalize(preprocess.eval_image(e, image_size=size, channels=c), mean, std),
    }


@pytest.mark.parametrize("name", ["train_image", "train_image_sniffed", "eval_image", "decode", "normalize"])
def test_map_functions_same_eagerly_and_in_dataset_map(info, name):
    records = raw_records(info, "train")
    picks = list(range(6))
    encoded = [records["image"][i] for i in picks]
    formats = [records["format"][i] for i in picks]
    seeds = [[i, 17] for i in picks]
    fn = _maps(info, 32)[name]
    eager = [fn(tf.constant(e), tf.constant(f), tf.constant(s, tf.int64)).numpy() for e, f, s in zip(encoded, formats, seeds)]
    ds = tf.data.Dataset.from_tensor_slices((encoded, formats, tf.constant(seeds, tf.int64))).map(fn)
    mapped = [x.numpy() for x in ds]
    assert len(mapped) == len(eager)
    for a, b in zip(eager, mapped):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)


def test_color_dataset_mixes_jpeg_and_png_records(color_dataset):
    # The mixed-format test above only means something if both decoders ran.
    formats = set(raw_records(DatasetInfo.load(str(color_dataset)), "train")["format"])
    assert formats == {b"jpeg", b"png"}


def test_train_crop_depends_on_seed_only():
    pixels = np.random.default_rng(0).integers(0, 255, (60, 90, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG")
    data = tf.constant(buf.getvalue())
    crop = lambda seed: preprocess.train_image(data, tf.constant("jpeg"), tf.constant(seed, tf.int64), image_size=24, channels=3).numpy()  # noqa: E731
    np.testing.assert_array_equal(crop([1, 2]), crop([1, 2]))
    assert not np.array_equal(crop([1, 2]), crop([3, 4]))


def test_eval_image_resizes_shorter_side_and_centre_crops():
    # 32x64: black, white middle half, black. Shorter side already 32, so the centre 32
    # columns are exactly the white band.
    pixels = np.zeros((32, 64, 1), np.uint8)
    pixels[:, 16:48] = 255
    buf = io.BytesIO()
    Image.fromarray(pixels[..., 0]).save(buf, "PNG")
    out = preprocess.eval_image(tf.constant(buf.getvalue()), image_size=32, channels=1, central_fraction=1.0).numpy()
    assert out.shape == (32, 32, 1)
    np.testing.assert_allclose(out, 255.0)
    # central_fraction 0.5: shorter side to 64, width to 128, then the centre 32x32 of it.
    half = preprocess.eval_image(tf.constant(buf.getvalue()), image_size=32, channels=1, central_fraction=0.5).numpy()
    np.testing.assert_allclose(half, 255.0, atol=1e-3)


def test_per_worker_sharding_is_disjoint_and_complete(mnist_dataset):
    info = DatasetInfo.load(str(mnist_dataset))
    contexts = [tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=i, num_replicas_in_sync=2) for i in range(2)]
    shares = [worker_files(info, "train", c) for c in contexts]
    assert set(shares[0]).isdisjoint(shares[1])
    assert sorted(shares[0] + shares[1]) == sorted(info.shard_paths("train"))
    assert all(shares)
    # And the pipelines built on them read exactly their records: the counts add up.
    seen = [sum(int(tf.shape(y)[0]) for _, y in make_dataset(info, "train", 64, training=False, image_size=28, input_context=c)) for c in contexts]
    assert seen[0] + seen[1] == info.examples("train")
    assert seen == [sum(info.shard_examples("train")[f] for f in s) for s in shares]


def test_too_few_files_for_pipelines_is_a_clear_error(mnist_dataset):
    info = DatasetInfo.load(str(mnist_dataset))
    shards = len(info.shard_paths("validation"))
    context = tf.distribute.InputContext(num_input_pipelines=shards + 1, input_pipeline_id=0)
    with pytest.raises(InputError, match=rf"{shards} shard file\(s\) for {shards + 1} input pipelines.*--num_shards"):
        make_dataset(info, "validation", 8, training=False, image_size=28, input_context=context)


def test_training_repeats_and_eval_does_not(mnist_dataset):
    info = DatasetInfo.load(str(mnist_dataset))
    train = make_dataset(info, "validation", 100, training=True, image_size=28, seed=0)
    assert len(list(train.take(20))) == 20  # 2,000 images from a 464-image split: it repeats
    evaluation = make_dataset(info, "validation", 100, training=False, image_size=28)
    assert evaluation.cardinality().numpy() == -(-info.examples("validation") // 100)
