"""The GPU check of issue 6: input pipeline with and without prefetch to the GPU, ResNet-50 on real
TFRecords against synthetic in-memory batches of the same shape, and GPU utilisation from nvidia-smi.

    python bench/gpu_check.py --data_dir DATASET [--batch_size 128 --image_size 224 --steps 60]

Printed: one markdown table and a last line of JSON. The gap between "real" and "synthetic"
training images/s is the input bottleneck; the issue's goal is real >= 0.85 x synthetic.
Without a GPU it stops with a message, unless --allow_cpu (the tests use that, tiny, so
that this script cannot rot while no GPU is around).
"""

import argparse
import json
import shutil
import subprocess
import sys
import threading
import time

import keras
import tensorflow as tf

from trainer import models
from trainer.bench import measure
from trainer.dataset import DatasetInfo
from trainer.input import make_dataset


class Utilisation:
    """Samples `nvidia-smi --query-gpu=utilization.gpu` every 200 ms while it is open."""

    def __init__(self):
        self.samples, self._proc = [], None

    def __enter__(self):
        if shutil.which("nvidia-smi"):
            cmd = ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "200", "-i", "0"]
            self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
            threading.Thread(target=self._read, daemon=True).start()
        return self

    def _read(self):
        for line in self._proc.stdout:
            if line.strip().isdigit():
                self.samples.append(int(line.strip()))

    def __exit__(self, *exc):
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait()

    @property
    def mean(self):
        return sum(self.samples) / len(self.samples) if self.samples else None


def synthetic(batch_size: int, image_size: int, channels: int, classes: int) -> tf.data.Dataset:
    """One batch of the same shape and dtypes as the reader's, repeated from memory (on the GPU when there is one)."""
    images = tf.random.uniform([batch_size, image_size, image_size, channels])
    labels = tf.random.uniform([batch_size], maxval=classes, dtype=tf.int64)
    return tf.data.Dataset.from_tensors((images, labels)).repeat()


def train_rate(model, dataset, warmup: int, steps: int):
    """(images/s, mean GPU utilisation %) of model.fit over `steps` steps after `warmup` steps."""
    model.fit(dataset, steps_per_epoch=warmup, epochs=1, verbose=0)  # compiles, fills buffers
    with Utilisation() as util:
        started = time.perf_counter()
        model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0)
        seconds = time.perf_counter() - started
    return steps * dataset.element_spec[0].shape[0] / seconds, util.mean


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data_dir", required=True)
    p.add_argument("--split", default="train")
    p.add_argument("--batch_size", type=int, default=128)
    p.add_argument("--image_size", type=int, default=224)
    p.add_argument("--model", default="resnet50")
    p.add_argument("--warmup", type=int, default=15, help="steps (batches) before timing")
    p.add_argument("--steps", type=int, default=60, help="timed steps (batches)")
    p.add_argument("--mixed_precision", action="store_true", help="mixed_float16: what a V100/A100/H100 user trains with")
    p.add_argument("--allow_cpu", action="store_true", help="run without a GPU (smoke test only: the numbers mean nothing)")
    args = p.parse_args(argv)

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus and not args.allow_cpu:
        print("gpu_check: TensorFlow sees no GPU (tf.config.list_physical_devices('GPU') is empty); "
              "install a CUDA build (pip install 'tensorflow[and-cuda]==2.21.0') or pass --allow_cpu for a smoke run", file=sys.stderr)
        return 2
    if args.mixed_precision:
        keras.mixed_precision.set_global_policy("mixed_float16")
    info = DatasetInfo.load(args.data_dir)
    size, classes = args.image_size, info.num_classes

    def reader(prefetch_to_device):
        return make_dataset(info, args.split, args.batch_size, training=True, image_size=size, prefetch_to_device=prefetch_to_device)

    rows = []
    # 1. The input pipeline alone: batches delivered per second, to the host and to the GPU.
    host = measure("input pipeline, prefetch to host memory", reader(False), args.warmup, args.steps)
    rows.append({"what": host.name, "images_per_second": host.images_per_second})
    if gpus:
        device = measure("input pipeline, prefetch_to_device('/gpu:0')", reader(True), args.warmup, args.steps)
        rows.append({"what": device.name, "images_per_second": device.images_per_second})

    # 2. Training: the same model, real batches from the shards, then synthetic batches in memory.
    results = {}
    for name, data in (("synthetic", synthetic(args.batch_size, size, info.channels, classes)), ("real", reader(None))):
        model = models.build(args.model, size, info.channels, classes)
        model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="sparse_categorical_crossentropy", jit_compile=False)
        rate, util = train_rate(model, data, args.warmup, args.steps)
        results[name] = rate
        rows.append({"what": f"{args.model} training, {name} data", "images_per_second": rate, "gpu_utilisation_percent": util})
        del model
        keras.backend.clear_session()
    ratio = results["real"] / results["synthetic"]

    print(f"\n{len(gpus)} GPU(s): {[g.name for g in gpus]}; batch {args.batch_size}, {size}x{size}, {args.steps} timed steps after {args.warmup}; "
          f"mixed precision {'on' if args.mixed_precision else 'off'}\n")
    print("| what | images/s | GPU utilisation (nvidia-smi mean) |")
    print("|---|---:|---:|")
    for row in rows:
        util = row.get("gpu_utilisation_percent")
        print(f"| {row['what']} | {row['images_per_second']:.0f} | {'' if util is None else f'{util:.0f}%'} |")
    print(f"\nreal / synthetic training rate: {ratio:.2f} (goal: at least 0.85)")
    print(json.dumps({"rows": rows, "real_over_synthetic": ratio, "gpus": len(gpus)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
