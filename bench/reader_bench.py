"""The reader against its decode ceiling: make_dataset over the shards vs decoding bytes already in memory.

    python bench/reader_bench.py --data_dir DATASET [--batch_size 128 --image_size 224 --batches 30 --reps 2]

Pipelines, measured interleaved in one process (A B C D, then D C B A, ...); the ratio is
against the issue's ceiling, decode + resize alone over bytes in memory:
  reader              trainer.input.make_dataset(training=True): shards -> interleave -> shuffle ->
                      batch -> parse_example -> train_batch (decode_and_crop_jpeg, flip) -> normalise
  ceiling (same ops)  the split's image bytes held in memory -> batch -> the same train_batch and
                      normalise, parallel map: everything the reader does except file I/O,
                      TFRecord framing, shuffling and parsing
  ceiling (same ops, per-image map)  the same train_image + normalise, but as a per-image
                      parallel map before batch instead of tf.map_fn over a batch
  ceiling (full decode + resize)  in-memory bytes -> per-image decode_jpeg + resize to SxS, parallel
                      map, then batch: the work of the naive one-file-at-a-time pipeline, minus its I/O
All maps use num_parallel_calls=AUTOTUNE and the reader's tf.data options (all cores).
"""

import argparse
import statistics
import sys

import tensorflow as tf

from trainer import preprocess
from trainer.bench import measure
from trainer.dataset import DatasetInfo
from trainer.input import AUTOTUNE, make_dataset, options


def load_bytes(info: DatasetInfo, split: str):
    image_key = info.name("image")
    spec = {image_key: info.parse_spec()[image_key]}
    ds = tf.data.TFRecordDataset(info.shard_paths(split)).map(lambda r: tf.io.parse_single_example(r, spec)[image_key])
    return tf.constant(list(ds.as_numpy_iterator()))


def ceiling_same_ops(info, encoded, batch_size, image_size):
    mean, std, channels = info.channel_mean, info.channel_std, info.channels
    ds = tf.data.Dataset.from_tensor_slices(encoded).repeat().batch(batch_size, drop_remainder=True)
    seeds = tf.data.Dataset.random(seed=0).batch(2, drop_remainder=True)

    def decode(batch, seed):
        images = preprocess.train_batch(batch, None, seed, image_size=image_size, channels=channels)
        return preprocess.normalize(images, mean, std), tf.zeros([tf.shape(batch)[0]], tf.int64)

    ds = tf.data.Dataset.zip((ds, seeds)).map(decode, num_parallel_calls=AUTOTUNE, deterministic=False)
    return ds.prefetch(AUTOTUNE).with_options(options(training=True, sharded_by_us=False))


def ceiling_same_ops_per_image(info, encoded, batch_size, image_size):
    """The same per-image ops (train_image, normalise) as a per-image parallel map, then batch."""
    mean, std, channels = info.channel_mean, info.channel_std, info.channels
    seeds = tf.data.Dataset.random(seed=0).batch(2, drop_remainder=True)
    ds = tf.data.Dataset.zip((tf.data.Dataset.from_tensor_slices(encoded).repeat(), seeds))

    def decode(data, seed):
        fmt = tf.where(preprocess.is_jpeg(data), "jpeg", "other")
        image = preprocess.train_image(data, fmt, seed, image_size=image_size, channels=channels)
        return preprocess.normalize(image, mean, std), tf.constant(0, tf.int64)

    ds = ds.map(decode, num_parallel_calls=AUTOTUNE, deterministic=False)
    return ds.batch(batch_size, drop_remainder=True).prefetch(AUTOTUNE).with_options(options(training=True, sharded_by_us=False))


def ceiling_full_decode(info, encoded, batch_size, image_size):
    channels = info.channels

    def decode(data):
        return tf.image.resize(tf.io.decode_jpeg(data, channels=channels), [image_size, image_size]), tf.constant(0, tf.int64)

    ds = tf.data.Dataset.from_tensor_slices(encoded).repeat().map(decode, num_parallel_calls=AUTOTUNE, deterministic=False)
    return ds.batch(batch_size, drop_remainder=True).prefetch(AUTOTUNE).with_options(options(training=True, sharded_by_us=False))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data_dir", required=True)
    p.add_argument("--split", default="train")
    p.add_argument("--batch_size", type=int, default=128)
    p.add_argument("--image_size", type=int, default=224)
    p.add_argument("--warmup_batches", type=int, default=5)
    p.add_argument("--batches", type=int, default=30)
    p.add_argument("--reps", type=int, default=2)
    args = p.parse_args(argv)
    info = DatasetInfo.load(args.data_dir)
    encoded = load_bytes(info, args.split)
    print(f"# {int(encoded.shape[0])} images held in memory for the ceilings", flush=True)
    pipelines = {
        "reader (make_dataset, training)": lambda: make_dataset(info, args.split, args.batch_size, training=True, image_size=args.image_size, shuffle_buffer=1000, seed=0, prefetch_to_device=False),
        "ceiling: same ops, bytes in memory": lambda: ceiling_same_ops(info, encoded, args.batch_size, args.image_size),
        "ceiling: same ops, per-image map, in memory": lambda: ceiling_same_ops_per_image(info, encoded, args.batch_size, args.image_size),
        "ceiling: full decode + resize, in memory": lambda: ceiling_full_decode(info, encoded, args.batch_size, args.image_size),
    }
    rates = {name: [] for name in pipelines}
    for rep in range(args.reps):
        for name, make in (list(pipelines.items()) if rep % 2 == 0 else list(pipelines.items())[::-1]):
            r = measure(name, make(), args.warmup_batches, args.batches)
            rates[name].append(r.images_per_second)
            print(f"# rep {rep + 1} {name:42} {r.images_per_second:8.1f} images/s", flush=True)
    # The ceiling: decode and resize alone over bytes already in memory, on every core.
    ref = statistics.median(rates["ceiling: full decode + resize, in memory"])
    print(f"\n{args.batches} batches of {args.batch_size} after {args.warmup_batches} warm-up, {args.reps} interleaved reps (order reversed every other rep), median; ratio = / ceiling (full decode + resize)\n")
    print("| pipeline | images/s | ratio |")
    print("|---|---:|---:|")
    for name, values in rates.items():
        m = statistics.median(values)
        print(f"| {name} | {m:.0f} | {m / ref:.2f}x |")


if __name__ == "__main__":
    sys.exit(main())
