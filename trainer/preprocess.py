"""Per-image map functions: decode, random resized crop and flip, eval resize and centre crop, normalise.

Every function takes and returns tensors only and draws randomness from an explicit
stateless seed, so it gives the same result eagerly, inside Dataset.map and inside the
exported serving function.
"""

import dataclasses

import tensorflow as tf

_JPEG_MAGIC = b"\xff\xd8\xff"
# One resize for training, evaluation and serving, so the model sees the same kind of pixels.
# No antialias: on 400x500 JPEGs it doubled the per-image cost (5.2 ms against 2.6 ms with
# the decode), and plain bilinear is what the reference ImageNet pipelines train with.
_RESIZE = {"method": "bilinear", "antialias": False}


@dataclasses.dataclass(frozen=True)
class Augment:
    """Training augmentation settings; the defaults are the usual ImageNet ones."""

    min_area: float = 0.08  # smallest crop, as a fraction of the image area
    max_area: float = 1.0
    min_ratio: float = 3 / 4  # crop aspect ratio range (width / height)
    max_ratio: float = 4 / 3
    flip: bool = True  # random left-right flip; turn off for digits and text

    def __post_init__(self):
        if not 0 < self.min_area <= self.max_area <= 1:
            raise ValueError(f"crop area range ({self.min_area}, {self.max_area}) must satisfy 0 < min <= max <= 1")
        if not 0 < self.min_ratio <= self.max_ratio:
            raise ValueError(f"crop ratio range ({self.min_ratio}, {self.max_ratio}) must satisfy 0 < min <= max")


def is_jpeg(encoded, image_format=None):
    """True when the bytes are JPEG: from the record's format when there is one, else from the magic bytes."""
    if image_format is not None:
        return tf.equal(tf.strings.lower(image_format), "jpeg")
    return tf.equal(tf.strings.substr(encoded, 0, 3), _JPEG_MAGIC)


def decode(encoded, channels: int):
    """Any stored image (JPEG, PNG, ...) to uint8 [H, W, channels]."""
    # expand_animations=False: a GIF gives its first frame, so the rank is always 3.
    image = tf.io.decode_image(encoded, channels=channels, expand_animations=False)
    image.set_shape([None, None, channels])
    return image


def _crop_window(shape, seed, augment: Augment):
    """A random crop window [y, x, h, w] inside an image of `shape` (stateless, from `seed`)."""
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape,
        bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], tf.float32, [1, 1, 4]),
        seed=seed,
        min_object_covered=0.0,  # the area range alone decides; there is no box to keep
        aspect_ratio_range=(augment.min_ratio, augment.max_ratio),
        area_range=(augment.min_area, augment.max_area),
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    return tf.stack([begin[0], begin[1], size[0], size[1]])


def train_image(encoded, image_format, seed, *, image_size: int, channels: int, augment: Augment = Augment()):
    """Random resized crop + optional flip of one stored image -> float32 [size, size, channels], 0..255."""
    seed = tf.cast(seed, tf.int64)
    crop_seed, flip_seed = seed, tf.stack([seed[0], seed[1] ^ 0x5DEECE66D])

    def jpeg():
        # Decoding only the crop window skips the IDCT of the discarded pixels: the main
        # CPU saving for large photos.
        window = _crop_window(tf.image.extract_jpeg_shape(encoded), crop_seed, augment)
        return tf.image.decode_and_crop_jpeg(encoded, window, channels=channels)

    def other():
        # PNG and others have no partial decode: decode all, then cut the same kind of window.
        image = decode(encoded, channels)
        window = _crop_window(tf.shape(image), crop_seed, augment)
        return tf.image.crop_to_bounding_box(image, window[0], window[1], window[2], window[3])

    image = tf.cond(is_jpeg(encoded, image_format), jpeg, other)
    image.set_shape([None, None, channels])
    image = tf.image.resize(image, [image_size, image_size], **_RESIZE)
    if augment.flip:
        image = tf.image.stateless_random_flip_left_right(image, flip_seed)
    return tf.cast(image, tf.float32)


def eval_image(encoded, *, image_size: int, channels: int, central_fraction: float = 0.875):
    """Resize the shorter side to image_size / central_fraction, then centre crop -> float32 [size, size, channels]."""
    if not 0 < central_fraction <= 1:
        raise ValueError(f"central_fraction {central_fraction!r} must be in (0, 1]")
    image = decode(encoded, channels)
    shape = tf.cast(tf.shape(image)[:2], tf.float32)
    target = tf.math.ceil(image_size / central_fraction)
    scale = target / tf.reduce_min(shape)
    new_hw = tf.maximum(tf.cast(tf.round(shape * scale), tf.int32), image_size)
    image = tf.image.resize(image, new_hw, **_RESIZE)
    top = (new_hw[0] - image_size) // 2
    left = (new_hw[1] - image_size) // 2
    image = tf.image.crop_to_bounding_box(image, top, left, image_size, image_size)
    return tf.cast(image, tf.float32)


def normalize(images, mean, std):
    """(images - mean) / std per channel, with the tf.Transform statistics (0..255 scale); [..., H, W, C]."""
    images = tf.cast(images, tf.float32)
    scale = 1.0 / tf.constant(std, tf.float32)
    offset = -tf.constant(mean, tf.float32) * scale
    # Broadcasting a [C] vector over the innermost axis is a slow path in TensorFlow's CPU
    # kernels: on 224x224x3 it cost 1.3 ms per image, as much as the decode, and halved the
    # reader's rate. Tiled to a full [H, W, C] plane first, the broadcast is over the outer
    # axes only (0.42 ms; bench/normalize_ops.py and docs/BENCHMARKS.md section 4).
    plane = tf.shape(images)[-3:]
    reps = tf.concat([plane[:2], [1]], 0)
    return images * tf.tile(scale[None, None, :], reps) + tf.tile(offset[None, None, :], reps)


def train_batch(encoded, formats, batch_seed, *, image_size: int, channels: int, augment: Augment = Augment()):
    """train_image over a batch; each image gets its own seed derived from the batch seed."""
    count = tf.shape(encoded)[0]
    seeds = tf.random.stateless_uniform([count, 2], seed=batch_seed, minval=None, maxval=None, dtype=tf.int64)
    if formats is None:  # records without a format feature: tell JPEG by its magic bytes
        formats = tf.where(is_jpeg(encoded), "jpeg", "other")

    def one(args):
        return train_image(args[0], args[1], args[2], image_size=image_size, channels=channels, augment=augment)

    spec = tf.TensorSpec([image_size, image_size, channels], tf.float32)
    return tf.map_fn(one, (encoded, formats, seeds), fn_output_signature=spec, parallel_iterations=16)


def eval_batch(encoded, *, image_size: int, channels: int, central_fraction: float = 0.875):
    """eval_image over a batch of encoded images."""
    spec = tf.TensorSpec([image_size, image_size, channels], tf.float32)
    fn = lambda e: eval_image(e, image_size=image_size, channels=channels, central_fraction=central_fraction)  # noqa: E731
    return tf.map_fn(fn, encoded, fn_output_signature=spec, parallel_iterations=16)
