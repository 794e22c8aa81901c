"""The training task: strategy, model, callbacks, fit, evaluation metrics and the SavedModel export."""

import dataclasses
import json
import os
import posixpath
import time

import keras
import tensorflow as tf

from trainer import integrity, models, preprocess
from trainer.dataset import DatasetInfo
from trainer.input import DEFAULT_CACHE_BUDGET, make_dataset


@dataclasses.dataclass
class TrainConfig:
    """Every training setting, in one place; the CLI flags map onto these fields."""

    data_dir: str
    job_dir: str
    version: int | None = None  # a pinned version of an updated dataset (beam-etl convert --update); None: the latest
    model: str = "small_cnn"
    epochs: int = 10
    steps_per_epoch: int = 0  # 0: one pass over the training split per epoch
    batch_size: int = 64  # global: split across replicas and workers
    image_size: int = 224
    learning_rate: float = 1e-3
    shuffle_buffer: int = 10_000
    min_crop_area: float = 0.08  # random resized crop: smallest fraction of the image kept
    flip: bool = True
    central_fraction: float = 0.875  # eval: centre crop this fraction after resizing
    train_split: str = "train"
    eval_split: str = "validation"
    cache_mb: int = DEFAULT_CACHE_BUDGET >> 20
    mixed_precision: str = "auto"  # auto: on when a GPU is present; on; off
    seed: int | None = None
    verbose: int = 2
    skip_corrupt: bool = False  # skip the damaged records of corrupt shards (reported) instead of stopping

    def __post_init__(self):
        for name in ("epochs", "batch_size", "image_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be at least 1, got {getattr(self, name)!r}")
        if self.steps_per_epoch < 0:
            raise ValueError(f"--steps_per_epoch must be 0 (a full pass) or more, got {self.steps_per_epoch!r}")
        if self.learning_rate <= 0:
            raise ValueError(f"--learning_rate must be positive, got {self.learning_rate!r}")
        if self.mixed_precision not in ("auto", "on", "off"):
            raise ValueError(f"--mixed_precision must be auto, on or off, not {self.mixed_precision!r}")

    @property
    def augment(self) -> preprocess.Augment:
        return preprocess.Augment(min_area=self.min_crop_area, flip=self.flip)


def choose_strategy() -> tf.distribute.Strategy:
    """MultiWorkerMirrored under TF_CONFIG, Mirrored for several GPUs, else the default (one device)."""
    # Must run before any other TensorFlow op: collective ops are configured at start-up.
    if os.environ.get("TF_CONFIG"):
        return tf.distribute.MultiWorkerMirroredStrategy()
    if len(tf.config.list_physical_devices("GPU")) > 1:
        return tf.distribute.MirroredStrategy()
    return tf.distribute.get_strategy()


def use_mixed_precision(setting: str) -> bool:
    """float16 compute only where it pays: on a GPU (on CPU it is slower and less accurate)."""
    has_gpu = bool(tf.config.list_physical_devices("GPU"))
    if setting == "on" and not has_gpu:
        raise ValueError("--mixed_precision on needs a GPU and none is visible; use auto or off")
    return has_gpu and setting != "off"


def is_chief() -> bool:
    """True for the worker that writes shared outputs (metrics, export): the only one, or worker 0."""
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    task = config.get("task", {})
    cluster = config.get("cluster", {})
    if task.get("type") == "chief" or not cluster:
        return True
    return task.get("type") == "worker" and task.get("index", 0) == 0 and "chief" not in cluster


def _join(*parts) -> str:
    return posixpath.join(*parts)


class ProgressLog(keras.callbacks.Callback):
    """Appends start, per-epoch and end records (with the optimizer step) to progress.jsonl."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path

    def _write(self, **record):
        record.update(pid=os.getpid(), step=int(self.model.optimizer.iterations.numpy()), time=time.time())
        with tf.io.gfile.GFile(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def on_train_begin(self, logs=None):
        # Runs after BackupAndRestore.on_train_begin, so a resumed run logs the restored step.
        self._write(event="start", epoch=int(getattr(self.model, "_initial_epoch", None) or 0))

    def on_epoch_end(self, epoch, logs=None):
        self._write(event="epoch", epoch=epoch + 1, **{k: float(v) for k, v in (logs or {}).items()})

    def on_train_end(self, logs=None):
        self._write(event="end")


def callbacks(config: TrainConfig, out_dir: str) -> list:
    """Backup/restore first (its restore must precede the others' on_train_begin), then checkpoints, logs."""
    found = [
        # Epoch granularity: Keras 3 restores the epoch, not the batch, so mid-epoch backups
        # would replay batches and overshoot the step count.
        keras.callbacks.BackupAndRestore(_join(out_dir, "backup")),
        keras.callbacks.ModelCheckpoint(_join(out_dir, "checkpoints", "epoch-{epoch:03d}.weights.h5"), save_weights_only=True),
    ]
    # TensorFlow 2.21 no longer installs TensorBoard: setup.py pins it.
    found.append(keras.callbacks.TensorBoard(_join(out_dir, "logs"), update_freq="epoch"))
    found.append(ProgressLog(_join(out_dir, "progress.jsonl")))
    return found


def train(config: TrainConfig) -> dict:
    """Train, evaluate, write metrics.json and the SavedModel export; return the metrics."""
    strategy = choose_strategy()
    if use_mixed_precision(config.mixed_precision):
        keras.mixed_precision.set_global_policy("mixed_float16")
    if config.seed is not None:
        keras.utils.set_random_seed(config.seed)
    info = DatasetInfo.load(config.data_dir, config.version)
    chief = is_chief()
    # Non-chief workers write their checkpoints and logs apart, so no file has two writers.
    out_dir = config.job_dir if chief else _join(config.job_dir, "workers", str(strategy.cluster_resolver.task_id))
    tf.io.gfile.makedirs(out_dir)

    readable, skipped = {}, {}
    if config.skip_corrupt:  # one read of the splits up front, to know what is lost and keep counts exact
        for split in {config.train_split, config.eval_split}:
            for path, (good, expected, error) in integrity.scan(info, split).items():
                readable[path], skipped[path] = good, expected - good
                print(f"trainer: skipping {expected - good} of {expected} records of {path}: {error}", flush=True)
    global_batch = config.batch_size
    steps = config.steps_per_epoch or max(1, info.examples(config.train_split) // global_batch)
    cache_budget = config.cache_mb << 20

    def train_input(context: tf.distribute.InputContext):
        return make_dataset(
            info,
            config.train_split,
            context.get_per_replica_batch_size(global_batch),
            training=True,
            image_size=config.image_size,
            input_context=context,
            shuffle_buffer=config.shuffle_buffer,
            cache_budget_bytes=cache_budget,
            augment=config.augment,
            central_fraction=config.central_fraction,
            seed=config.seed,
            readable=readable or None,
        )

    train_ds = strategy.distribute_datasets_from_function(train_input)
    eval_ds = eval_dataset(info, config, global_batch, cache_budget, readable=readable or None)

    with strategy.scope():
        model = models.build(config.model, config.image_size, info.channels, info.num_classes)
        model.compile(
            optimizer=keras.optimizers.Adam(learning_rate_schedule(config, steps)),
            loss=keras.losses.SparseCategoricalCrossentropy(),
            metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        )
    started = time.time()
    try:
        history = model.fit(
            train_ds,
            epochs=config.epochs,
            steps_per_epoch=steps,
            validation_data=eval_ds,
            callbacks=callbacks(config, out_dir),
            verbose=config.verbose,
        )
        seconds = time.time() - started
        evaluation = model.evaluate(eval_ds, return_dict=True, verbose=0)
    except tf.errors.DataLossError:
        raise integrity.corrupt_error(info, [config.train_split, config.eval_split]) from None
    metrics = {
        "val_accuracy": float(evaluation["accuracy"]),
        "val_loss": float(evaluation["loss"]),
        "eval_split": config.eval_split,
        "eval_examples": info.examples(config.eval_split),
        "train_accuracy": float(history.history["accuracy"][-1]) if history.history.get("accuracy") else None,
        "epochs_run": len(history.history.get("loss", [])),
        "final_step": int(model.optimizer.iterations.numpy()),
        "train_seconds": seconds,
        "config": dataclasses.asdict(config),
        "replicas": strategy.num_replicas_in_sync,
        "strategy": type(strategy).__name__,
        "mixed_precision": keras.mixed_precision.global_policy().name,
        "label_names": list(info.label_names),
        "skipped_records": skipped,
    }
    if chief:
        model.save(_join(out_dir, "model.keras"))
        export(model, info, config, _join(out_dir, "export"))
        with tf.io.gfile.GFile(_join(out_dir, "metrics.json"), "w") as f:
            json.dump(metrics, f, indent=2)
    return metrics


def learning_rate_schedule(config: TrainConfig, steps_per_epoch: int):
    """Cosine decay to zero over the whole run: the last epochs settle instead of bouncing."""
    # Driven by optimizer.iterations, so a resumed run continues on the same curve.
    return keras.optimizers.schedules.CosineDecay(config.learning_rate, decay_steps=config.epochs * steps_per_epoch)


def eval_dataset(info: DatasetInfo, config: TrainConfig, batch_size: int, cache_budget: int, **kwargs) -> tf.data.Dataset:
    """The evaluation split as the trainer evaluates it: deterministic, no augmentation."""
    return make_dataset(
        info,
        config.eval_split,
        batch_size,
        training=False,
        image_size=config.image_size,
        cache_budget_bytes=cache_budget,
        central_fraction=config.central_fraction,
        **kwargs,
    )


def export(model: keras.Model, info: DatasetInfo, config: TrainConfig, path: str) -> str:
    """SavedModel whose serving_default takes encoded image bytes and returns class_id, label, probabilities."""
    labels = tf.constant(list(info.label_names))
    mean, std = info.channel_mean, info.channel_std

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="image_bytes")])
    def serve(image_bytes):
        # The evaluation preprocessing and the TFT statistics, so serving sees what eval saw.
        images = preprocess.eval_batch(image_bytes, image_size=config.image_size, channels=info.channels, central_fraction=config.central_fraction)
        probabilities = tf.cast(model(preprocess.normalize(images, mean, std), training=False), tf.float32)
        class_id = tf.argmax(probabilities, axis=-1)
        return {"class_id": class_id, "label": tf.gather(labels, class_id), "probabilities": probabilities}

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint("serving_default", serve)
    archive.write_out(path, verbose=False)
    return path
