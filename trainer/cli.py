"""Command line: `trainer train` and `trainer bench`."""

import argparse
import dataclasses
import json
import sys

from trainer.dataset import DatasetError
from trainer.integrity import CorruptShard


def _train_parser(sub):
    from trainer.task import TrainConfig  # defaults come from the one dataclass

    d = TrainConfig(data_dir="", job_dir="")
    p = sub.add_parser("train", help="train a model on a converted dataset directory")
    p.add_argument("--data_dir", required=True, help="a `beam-etl convert --output` directory")
    p.add_argument("--job_dir", required=True, help="checkpoints, logs, metrics.json and export/ go here")
    p.add_argument("--version", type=int, default=None, help="train on this version of an updated dataset (versions/); default: the latest")
    p.add_argument("--model", default=d.model, help="small_cnn, mobilenet_v2 or resnet50")
    p.add_argument("--epochs", type=int, default=d.epochs)
    p.add_argument("--steps_per_epoch", type=int, default=d.steps_per_epoch, help="0: one pass over the training split")
    p.add_argument("--batch_size", type=int, default=d.batch_size, help="global batch size")
    p.add_argument("--image_size", type=int, default=d.image_size)
    p.add_argument("--learning_rate", type=float, default=d.learning_rate)
    p.add_argument("--shuffle_buffer", type=int, default=d.shuffle_buffer)
    p.add_argument("--min_crop_area", type=float, default=d.min_crop_area, help="random resized crop: smallest area fraction")
    p.add_argument("--no_flip", dest="flip", action="store_false", help="no random left-right flip (digits, text)")
    p.add_argument("--central_fraction", type=float, default=d.central_fraction, help="eval centre crop fraction")
    p.add_argument("--train_split", default=d.train_split)
    p.add_argument("--eval_split", default=d.eval_split)
    p.add_argument("--cache_mb", type=int, default=d.cache_mb, help="cache a split in memory when it fits this")
    p.add_argument("--mixed_precision", choices=("auto", "on", "off"), default=d.mixed_precision)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--verbose", type=int, default=d.verbose)
    p.add_argument("--skip_corrupt", action="store_true", help="skip the damaged records of corrupt shards, and report how many, instead of stopping")
    return p


def _bench_parser(sub):
    p = sub.add_parser("bench", help="input pipeline images/s, no model")
    p.add_argument("--data_dir", required=True)
    p.add_argument("--source_dir", default=None, help="the converter's input image folder, for the naive baseline")
    p.add_argument("--split", default="train")
    p.add_argument("--batch_size", type=int, default=128)
    p.add_argument("--image_size", type=int, default=224)
    p.add_argument("--warmup_batches", type=int, default=5)
    p.add_argument("--batches", type=int, default=50)
    return p


def main(argv=None) -> int:
    """Entry point of the `trainer` console script and `python -m trainer`."""
    parser = argparse.ArgumentParser(prog="trainer", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _train_parser(sub)
    _bench_parser(sub)
    args = vars(parser.parse_args(argv))
    command = args.pop("command")
    if str(args.get("data_dir", "")).startswith("s3://"):  # before TensorFlow's import and any work
        print(f"trainer {command}: error: --data_dir {args['data_dir']}: TensorFlow 2.21 has no s3:// filesystem, "
              "so tf.data can't read these shards; copy the dataset to local disk or gs:// first "
              f"(for example `aws s3 sync {args['data_dir']} /data/ds`)", file=sys.stderr)
        return 2
    try:
        if command == "train":
            from trainer import task

            metrics = task.train(task.TrainConfig(**args))
            print(json.dumps({k: v for k, v in metrics.items() if k not in ("config", "label_names")}, indent=2))
            print(f"validation accuracy: {metrics['val_accuracy']:.1%} on {metrics['eval_examples']} {metrics['eval_split']} images")
        else:
            from trainer import bench

            results = bench.run(**args)
            print(bench.table(results))
            print(json.dumps([dict(dataclasses.asdict(r), images_per_second=r.images_per_second) for r in results]))
    except CorruptShard as e:  # the data is damaged, not the command
        print(f"trainer {command}: error: {e}", file=sys.stderr)
        return 1
    except (DatasetError, ValueError, FileNotFoundError) as e:
        print(f"trainer {command}: error: {e}", file=sys.stderr)
        return 2
    return 0
