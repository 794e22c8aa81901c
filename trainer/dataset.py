"""The dataset directory contract (docs/DATASET.md) as the trainer sees it: dataset.json plus the TFT output."""

import dataclasses
import json
import posixpath

import numpy as np
import tensorflow as tf

SUPPORTED_FORMAT_VERSIONS = (1,)
# The roles the input pipeline parses; every other role stays in the records unread.
PARSED_ROLES = ("image", "label", "format")
_TF_DTYPES = {"string": tf.string, "int64": tf.int64, "float32": tf.float32, "float": tf.float32}


class DatasetError(ValueError):
    """A dataset directory that breaks the contract; the message names the value and the fix."""


def _join(directory: str, name: str) -> str:
    # posixpath keeps gs:// and s3:// URIs intact, where os.path.join would not on Windows.
    return posixpath.join(directory.rstrip("/"), name)


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What the trainer knows about one converted dataset directory."""

    data_dir: str
    features: dict  # role -> {"name", "dtype", "shape"}
    label_names: tuple
    channels: int
    compression: str  # the TFRecordDataset argument: "" or "GZIP"
    splits: dict  # split -> {"examples", "bytes", "shards": [...]}
    channel_mean: np.ndarray  # float32 [channels], 0..255 scale, from tf.Transform
    channel_std: np.ndarray
    image_format: str = ""  # the converter's --image_format when dataset.json records it
    excluded: tuple = ()  # "generation/key" of old records a later version dropped (beam-etl convert --update)
    version: int = 1

    @classmethod
    def load(cls, data_dir: str, version: int | None = None) -> "DatasetInfo":
        """Read dataset.json (or a pinned version's document) and the tf.Transform output of `data_dir`."""
        meta = read_metadata(data_dir, version)
        labels = tuple(meta["label_names"])
        mean, std, vocabulary = read_transform(_transform_dir(data_dir, meta), meta)
        if vocabulary != labels:
            raise DatasetError(
                f"{data_dir}: the TFT 'label' vocabulary {list(vocabulary)[:5]}... differs from dataset.json "
                f"label_names {list(labels)[:5]}...; the directory mixes two conversions, convert it again"
            )
        return cls(
            data_dir=data_dir,
            features=meta["features"],
            label_names=labels,
            channels=int(meta["channels"]),
            compression=meta.get("tfrecord_compression", "GZIP" if meta.get("compression") == "gzip" else ""),
            splits=meta["splits"],
            channel_mean=mean,
            channel_std=std,
            image_format=str(meta.get("options", {}).get("image_format", "")),
            excluded=tuple(f"{generation}/{key}" for generation, key in meta.get("excluded", {}).get("records", ())),
            version=int(meta.get("version", 1)),
        )

    def name(self, role: str) -> str:
        """The feature key that holds `role` in this dataset's records."""
        try:
            return self.features[role]["name"]
        except KeyError:
            raise DatasetError(f"{self.data_dir}: dataset.json has no feature for role {role!r}; roles: {sorted(self.features)}") from None

    def parse_spec(self) -> dict:
        """tf.io.parse_example spec for the roles the pipeline reads, keyed by feature name."""
        spec = {}
        for role in PARSED_ROLES:
            feature = self.features.get(role)
            if feature is None:
                if role == "format":  # optional: decoding then sniffs the bytes instead
                    continue
                raise DatasetError(f"{self.data_dir}: dataset.json has no {role!r} feature; convert the images again")
            dtype = _TF_DTYPES[feature["dtype"]]
            spec[feature["name"]] = tf.io.FixedLenFeature(feature.get("shape", []), dtype)
        return spec

    def _split(self, split: str) -> dict:
        try:
            return self.splits[split]
        except KeyError:
            raise DatasetError(f"{self.data_dir} has no split {split!r}; it has {sorted(self.splits)}") from None

    def shard_paths(self, split: str) -> list:
        """Full paths of the split's shards, in dataset.json order."""
        shards = self._split(split)["shards"]
        if not shards:
            raise DatasetError(f"{self.data_dir}: split {split!r} has no shards; convert with more images in it")
        return [_join(self.data_dir, shard["file"]) for shard in shards]

    def shard_examples(self, split: str) -> dict:
        """Shard path -> how many records it holds."""
        shards = self._split(split)["shards"]
        return {_join(self.data_dir, shard["file"]): int(shard["examples"]) for shard in shards}

    def shard_generations(self, split: str) -> dict:
        """Shard path -> the version that wrote it (1 for a first conversion)."""
        return {_join(self.data_dir, shard["file"]): int(shard.get("generation", 1)) for shard in self._split(split)["shards"]}

    def examples(self, split: str) -> int:
        """How many records the split holds."""
        return int(self._split(split)["examples"])

    def split_bytes(self, split: str) -> int:
        """Stored bytes of the split's records (what caching the raw records costs)."""
        info = self._split(split)
        return int(info.get("bytes") or sum(int(s.get("bytes", 0)) for s in info["shards"]))

    @property
    def num_classes(self) -> int:
        return len(self.label_names)


def _version_json(version: int) -> str:
    return f"versions/v{version:05d}.json"  # beam_etl.metadata.version_json (the trainer imports no beam_etl)


def _transform_dir(data_dir: str, meta: dict) -> str:
    """Where a version's tf.Transform output is: versions/vNNNNN/ once a dataset is updated, else in place.

    The in-place copy is the latest version's too, but an update replaces it while readers of
    the version before may still load it; each version's own folder never changes.
    """
    folder = _join(data_dir, f"versions/v{int(meta.get('version', 1)):05d}")
    return folder if tf.io.gfile.exists(_join(folder, "transform_fn")) else data_dir


def read_metadata(data_dir: str, version: int | None = None) -> dict:
    """dataset.json (or version `version`'s document) as a dict, checked for the keys the trainer uses."""
    path = _join(data_dir, "dataset.json")
    if version is not None:
        pinned = _join(data_dir, _version_json(version))
        if tf.io.gfile.exists(pinned):
            path = pinned
        else:  # a dataset never updated has only dataset.json: version 1, or the latest
            with tf.io.gfile.GFile(path, "r") as f:
                latest = int(json.load(f).get("version", 1))
            if latest != version:
                raise DatasetError(f"{data_dir} has no version {version}: its versions are 1..{latest} (versions/*.json)")
    try:
        with tf.io.gfile.GFile(path, "r") as f:
            meta = json.load(f)
    except tf.errors.NotFoundError:
        raise DatasetError(f"{path} not found: --data_dir must be a finished `beam-etl convert --output` directory") from None
    except json.JSONDecodeError as e:
        raise DatasetError(f"{path} is not valid JSON ({e}); convert the images again") from None
    version = meta.get("format_version")
    if version not in SUPPORTED_FORMAT_VERSIONS:
        raise DatasetError(f"{path}: format_version {version!r} is not one of {SUPPORTED_FORMAT_VERSIONS}; upgrade the trainer")
    missing = [key for key in ("features", "label_names", "channels", "splits") if key not in meta]
    if missing:
        raise DatasetError(f"{path} lacks {missing}; convert the images again with a current beam-etl")
    if int(meta["channels"]) not in (1, 3):
        raise DatasetError(f"{path}: channels {meta['channels']!r} must be 1 or 3")
    return meta


def read_transform(data_dir: str, meta: dict):
    """(channel_mean, channel_std, label vocabulary) from the TFT output in `data_dir`."""
    import tensorflow_transform as tft  # heavy import, only where the contract needs it

    transform = meta.get("transform", {})
    try:
        output = tft.TFTransformOutput(data_dir)
        vocabulary = tuple(v.decode() if isinstance(v, bytes) else v for v in output.vocabulary_by_name(transform.get("vocabulary", "label")))
    except (tf.errors.NotFoundError, OSError) as e:
        raise DatasetError(f"{data_dir}: no readable tf.Transform output ({e}); the conversion did not finish, run it again") from None
    channels = int(meta["channels"])
    # channel_mean/std are analyser constants: transforming any one row yields them.
    row = {
        "label_text": tf.constant([meta["label_names"][0]]),
        "pixel_mean": tf.zeros([1, channels], tf.float32),
        "pixel_sq_mean": tf.zeros([1, channels], tf.float32),
    }
    out = output.transform_raw_features(row)
    mean = np.asarray(out["channel_mean"][0], np.float32)
    std = np.asarray(out["channel_std"][0], np.float32)
    if mean.shape != (channels,) or not np.all(std > 0):
        raise DatasetError(f"{data_dir}: TFT gave channel_mean {mean} / channel_std {std} for {channels} channels; convert again")
    return mean, std, vocabulary
