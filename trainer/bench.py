"""Input pipeline throughput, no model: the TFRecord pipeline against one-image-file-at-a-time reading."""

import dataclasses
import time

import tensorflow as tf

from trainer import preprocess
from trainer.dataset import DatasetInfo
from trainer.input import make_dataset

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


@dataclasses.dataclass(frozen=True)
class Result:
    """One measured pipeline."""

    name: str
    images: int
    seconds: float

    @property
    def images_per_second(self) -> float:
        return self.images / self.seconds if self.seconds > 0 else float("nan")


def measure(name: str, dataset: tf.data.Dataset, warmup_batches: int, batches: int) -> Result:
    """Images/s over `batches` batches, after `warmup_batches` that fill buffers and tracing caches."""
    iterator = iter(dataset)
    for _ in range(warmup_batches):
        next(iterator)
    images, started = 0, time.perf_counter()
    for _ in range(batches):
        try:
            batch = next(iterator)
        except StopIteration:
            break
        images += int(tf.shape(batch[0])[0])
    return Result(name, images, time.perf_counter() - started)


def source_files(source_dir: str) -> list:
    """Every image file under source_dir (any depth), sorted."""
    files = []
    for root, _, names in tf.io.gfile.walk(source_dir):
        files.extend(f"{root.rstrip('/')}/{n}" for n in names if n.lower().endswith(IMAGE_SUFFIXES))
    if not files:
        raise FileNotFoundError(f"no {'/'.join(IMAGE_SUFFIXES)} files under --source_dir {source_dir!r}; point it at the converter's input folder")
    return sorted(files)


def naive_dataset(files: list, batch_size: int, image_size: int, channels: int) -> tf.data.Dataset:
    """The baseline: list_files -> read_file -> decode -> resize -> batch, one file at a time."""
    ds = tf.data.Dataset.list_files(files, shuffle=True).repeat()

    def load(path):
        data = tf.io.read_file(path)
        # decode_jpeg for JPEG as the baseline names it; decode_image for the PNG datasets.
        image = tf.cond(
            preprocess.is_jpeg(data),
            lambda: tf.io.decode_jpeg(data, channels=channels),
            lambda: preprocess.decode(data, channels),
        )
        return tf.image.resize(image, [image_size, image_size]), path

    options = tf.data.Options()
    # One file at a time, as named: tf.data would otherwise parallelise this map by itself
    # (map_parallelization is on by default), which is no longer the naive baseline.
    options.experimental_optimization.map_parallelization = False
    return ds.map(load).batch(batch_size).with_options(options)  # no num_parallel_calls, no prefetch


def run(data_dir: str, source_dir: str | None = None, *, batch_size: int = 128, image_size: int = 224,
        warmup_batches: int = 5, batches: int = 50, split: str = "train") -> list:
    """Measure the pipelines and return their Results, TFRecord first."""
    info = DatasetInfo.load(data_dir)
    tfrecord = make_dataset(info, split, batch_size, training=True, image_size=image_size, shuffle_buffer=1000, seed=0, prefetch_to_device=False)
    results = [measure("tfrecord (make_dataset, training)", tfrecord, warmup_batches, batches)]
    if source_dir:
        naive = naive_dataset(source_files(source_dir), batch_size, image_size, info.channels)
        results.append(measure("naive (one file at a time)", naive, warmup_batches, batches))
    return results


def table(results: list) -> str:
    """The results as a text table; the ratio is against the last (baseline) row."""
    base = results[-1].images_per_second
    lines = [f"{'pipeline':36} {'images':>8} {'seconds':>8} {'images/s':>10} {'ratio':>7}"]
    for r in results:
        lines.append(f"{r.name:36} {r.images:8d} {r.seconds:8.2f} {r.images_per_second:10.1f} {r.images_per_second / base:6.2f}x")
    return "\n".join(lines)
