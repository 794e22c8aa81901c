"""The tf.data input pipeline over a converted dataset directory: make_dataset and its options.

The order of the steps in make_dataset, and why:

1. File list, sorted as dataset.json lists it. Shuffled every epoch in training, so the
   interleave below mixes different shards together each epoch.
2. Per-worker sharding by file, *before* the shuffle: every worker starts from the same
   deterministic list, so the shards are disjoint and cover all files without the workers
   having to agree on a seed. Sharding by file (not by record) means each worker reads only
   its own files instead of reading everything and dropping most of it.
3. Parallel interleave over TFRecordDataset: reads several shards at once, hiding file
   latency (object stores especially); deterministic=False in training, so a slow shard
   does not hold back the others.
   (Training caches the raw records here when they fit the memory budget: see step 7.)
4. Shuffle with a buffer, then repeat: shuffling before repeat keeps epoch boundaries
   (every record once per epoch) and reshuffle_each_iteration gives a new order each epoch.
5. Batch, then parse the whole batch with one tf.io.parse_example call: one vectorised
   parse per batch is much cheaper than one parse per record.
6. Decode in parallel (num_parallel_calls across batches): training does a random resized
   crop with decode_and_crop_jpeg (PNG: decode, then crop) and a flip; evaluation
   resizes the shorter side and centre crops. Then normalise with the TFT statistics.
7. cache() only when the split fits the memory budget. Evaluation caches the finished
   batches (they are the same every epoch). Training caches the raw records after step 3
   instead: caching after augmentation would freeze one random crop per image forever.
8. prefetch last, so the next batches are prepared while the model trains; on a GPU
   without a tf.distribute strategy, prefetch_to_device is the very last step so batches
   wait in GPU memory (under a strategy, distribute_datasets_from_function does this).
"""

import tensorflow as tf

from trainer import preprocess
from trainer.dataset import DatasetInfo

AUTOTUNE = tf.data.AUTOTUNE
DEFAULT_CACHE_BUDGET = 1 << 30  # bytes; a split bigger than this streams from disk every epoch


class InputError(ValueError):
    """A pipeline request the dataset cannot satisfy; the message says what to change."""


def options(*, training: bool, sharded_by_us: bool) -> tf.data.Options:
    """Every tf.data option the pipeline sets, in one place."""
    opts = tf.data.Options()
    opts.autotune.enabled = True  # let tf.data size parallelism and buffers from measurements
    # Training trades order for throughput (a slow shard or image does not stall the rest);
    # evaluation keeps order so runs and the export check are repeatable.
    opts.deterministic = not training
    # Share the process's inter-op pool (0 = default) and let big ops (resize of a 224px crop)
    # use intra-op threads too: measured ~10% more images/s than max_intra_op_parallelism=1
    # on 224px JPEGs, and no different on 28px digits.
    opts.threading.private_threadpool_size = 0
    opts.threading.max_intra_op_parallelism = 0
    opts.experimental_optimization.map_parallelization = True
    opts.experimental_optimization.parallel_batch = True
    if sharded_by_us:
        # We shard by file from the InputContext; tf.distribute must not shard again.
        opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return opts


def worker_files(info: DatasetInfo, split: str, input_context=None) -> list:
    """This input pipeline's share of the split's shard files."""
    files = info.shard_paths(split)
    if input_context is None or input_context.num_input_pipelines == 1:
        return files
    pipelines, index = input_context.num_input_pipelines, input_context.input_pipeline_id
    if len(files) < pipelines:
        raise InputError(
            f"split {split!r} of {info.data_dir} has {len(files)} shard file(s) for {pipelines} input pipelines; "
            f"convert again with --num_shards {split}={pipelines} or more (a multiple of {pipelines} balances best)"
        )
    return files[index::pipelines]


def _has_gpu() -> bool:
    return bool(tf.config.list_logical_devices("GPU"))


def make_dataset(
    data_dir,
    split: str,
    batch_size: int,
    *,
    training: bool,
    image_size: int,
    input_context=None,
    shuffle_buffer: int = 10_000,
    cycle_length: int = 8,
    block_length: int = 1,
    cache_budget_bytes: int = DEFAULT_CACHE_BUDGET,
    augment: preprocess.Augment = preprocess.Augment(),
    central_fraction: float = 0.875,
    repeat: bool | None = None,
    seed: int | None = None,
    prefetch_to_device: bool | None = None,
    readable: dict | None = None,
) -> tf.data.Dataset:
    """(images float32 [B, S, S, C] normalised, labels int64 [B]) batches of one split.

    `data_dir` is a directory or a DatasetInfo. `batch_size` is per input pipeline: under a
    strategy pass input_context.get_per_replica_batch_size(global_batch). `repeat` defaults
    to `training`. `seed` fixes file order, shuffling and augmentation (tests); None varies them.
    `readable` ({shard path: records readable}, from trainer.integrity) skips the damaged
    records of those shards instead of failing on them (--skip_corrupt).
    """
    info = data_dir if isinstance(data_dir, DatasetInfo) else DatasetInfo.load(data_dir)
    if batch_size < 1 or image_size < 1:
        raise InputError(f"batch_size {batch_size} and image_size {image_size} must be positive")
    repeat = training if repeat is None else repeat
    channels = info.channels

    # 1-2. The split's files, this worker's share, shuffled each epoch in training.
    files = worker_files(info, split, input_context)
    generations = info.shard_generations(split)
    ds = tf.data.Dataset.from_tensor_slices((files, [generations[f] for f in files]))
    if training:
        ds = ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    live = _live_filter(info) if info.excluded else None

    # 3. Read several shards at once.
    def read(path, generation):
        records = tf.data.TFRecordDataset(path, compression_type=info.compression, buffer_size=8 << 20)
        # A TFRecord reader cannot resynchronise after a damaged record: the rest of that shard is lost.
        records = records.ignore_errors() if readable else records
        # An updated dataset's old shards still hold the records a later version changed or removed.
        return records.filter(lambda record: live(record, generation)) if live is not None else records

    ds = ds.interleave(
        read,
        cycle_length=max(1, min(cycle_length, len(files))),
        block_length=block_length,
        num_parallel_calls=AUTOTUNE,
        deterministic=not training,
    )
    # The record count is in dataset.json; telling tf.data lets Keras size evaluation epochs.
    counts = dict(info.shard_examples(split), **(readable or {}))
    records = sum(counts[f] for f in files)
    if live is not None:  # which shard holds an excluded record is not recorded: only the whole split's count is known
        records = info.examples(split) if len(files) == len(generations) and not readable else None
    if records is not None:
        ds = ds.apply(tf.data.experimental.assert_cardinality(records))
    fits = _share_bytes(info, split, len(files), input_context) <= cache_budget_bytes
    if training and fits:
        ds = ds.cache()  # 7 (training): raw records, so augmentation stays random every epoch

    # 4. Shuffle, then repeat.
    if training:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    if repeat:
        ds = ds.repeat()

    # 5. Batch, then one parse per batch. Training drops the remainder so every step has the
    # same static shape (replicas and XLA want that); evaluation keeps every record.
    ds = ds.batch(batch_size, drop_remainder=training)
    spec = info.parse_spec()
    image_key, label_key = info.name("image"), info.name("label")
    format_key = info.features.get("format", {}).get("name")
    ds = ds.map(lambda records: tf.io.parse_example(records, spec), num_parallel_calls=AUTOTUNE, deterministic=not training)

    # 6. Decode in parallel, then normalise.
    mean, std = info.channel_mean, info.channel_std
    if training:
        # One stateless seed per batch: repeatable with `seed`, and the map functions stay pure.
        seeds = tf.data.Dataset.random(seed=seed).batch(2, drop_remainder=True)
        ds = tf.data.Dataset.zip((ds, seeds))

        def decode(parsed, batch_seed):
            formats = parsed[format_key] if format_key else None
            images = preprocess.train_batch(
                parsed[image_key], formats, batch_seed, image_size=image_size, channels=channels, augment=augment
            )
            return preprocess.normalize(images, mean, std), parsed[label_key]

    else:

        def decode(parsed):
            images = preprocess.eval_batch(parsed[image_key], image_size=image_size, channels=channels, central_fraction=central_fraction)
            return preprocess.normalize(images, mean, std), parsed[label_key]

    ds = ds.map(decode, num_parallel_calls=AUTOTUNE, deterministic=not training)

    # 7 (evaluation): finished batches, when the decoded split fits.
    decoded_bytes = info.examples(split) * image_size * image_size * channels * 4
    if not training and not repeat and decoded_bytes <= cache_budget_bytes:
        ds = ds.cache()

    # 8. Prefetch; to the GPU as the very last step when no strategy does it for us.
    ds = ds.prefetch(AUTOTUNE)
    ds = ds.with_options(options(training=training, sharded_by_us=input_context is not None))
    if prefetch_to_device is None:
        prefetch_to_device = input_context is None and _has_gpu()
    if prefetch_to_device:
        ds = ds.apply(tf.data.experimental.prefetch_to_device("/gpu:0"))
    return ds


def _live_filter(info: DatasetInfo):
    """record, generation -> False for a record a later version excluded (its "generation/key" is listed)."""
    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(tf.constant(list(info.excluded)), tf.ones([len(info.excluded)], tf.int64)), default_value=0
    )
    key_spec = {info.name("key"): tf.io.FixedLenFeature([], tf.string)}

    def live(record, generation):
        key = tf.io.parse_single_example(record, key_spec)[info.name("key")]
        return table.lookup(tf.strings.join([tf.strings.as_string(generation), key], separator="/")) == 0

    return live


def _share_bytes(info: DatasetInfo, split: str, files: int, input_context) -> int:
    """Stored bytes this pipeline reads: its share of the split."""
    total = info.split_bytes(split)
    shards = len(info.shard_paths(split))
    return total * files // max(1, shards)
