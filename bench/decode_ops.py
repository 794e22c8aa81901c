"""Which op of the training crop chain costs what, per image, over JPEG bytes held in memory (all cores).

    python bench/decode_ops.py [--photos /tmp/photos5k] [variant ...]

Each variant is a per-image parallel map over 1,024 JPEGs in memory, then batch(128);
3 interleaved reps, median images/s, ratio against `full` (decode_jpeg + resize).
Then the training chain as the reader applies it (tf.map_fn over a batch) against per image.
"""
import glob, sys, time, statistics
import tensorflow as tf
from trainer import preprocess

args = sys.argv[1:]
photos = '/tmp/photos5k'
if args[:1] == ['--photos']:
    photos, args = args[1], args[2:]
files = sorted(glob.glob(f'{photos}/*/*.jpg'))[:1024]
data = tf.constant([open(f, 'rb').read() for f in files])
S = 224

def v_full(x, seed):
    return tf.cast(tf.image.resize(tf.io.decode_jpeg(x, channels=3), [S, S]), tf.float32)
def v_full_nofloat(x, seed):
    return tf.image.resize(tf.io.decode_jpeg(x, channels=3), [S, S], antialias=False)
def v_train(x, seed):
    return preprocess.train_image(x, tf.constant("jpeg"), seed, image_size=S, channels=3)
def v_train_norm(x, seed):
    return preprocess.normalize(v_train(x, seed), [120.0, 115.0, 100.0], [60.0, 58.0, 62.0])
def v_crop_only(x, seed):
    w = preprocess._crop_window(tf.image.extract_jpeg_shape(x), tf.cast(seed, tf.int64), preprocess.Augment())
    return tf.image.decode_and_crop_jpeg(x, w, channels=3)[:1, :1]
def v_crop_resize(x, seed):
    w = preprocess._crop_window(tf.image.extract_jpeg_shape(x), tf.cast(seed, tf.int64), preprocess.Augment())
    return tf.image.resize(tf.image.decode_and_crop_jpeg(x, w, channels=3), [S, S], antialias=False)
def v_fullcrop_resize(x, seed):
    img = tf.io.decode_jpeg(x, channels=3)
    w = preprocess._crop_window(tf.shape(img), tf.cast(seed, tf.int64), preprocess.Augment())
    img = img[w[0]:w[0]+w[2], w[1]:w[1]+w[3]]
    return tf.image.resize(img, [S, S], antialias=False)
def v_decode_only(x, seed):
    return tf.io.decode_jpeg(x, channels=3)[:1, :1]
def v_window_only(x, seed):
    return preprocess._crop_window(tf.image.extract_jpeg_shape(x), tf.cast(seed, tf.int64), preprocess.Augment())

variants = dict(full=v_full, full_nofloat=v_full_nofloat, train=v_train, train_norm=v_train_norm, crop_only=v_crop_only, crop_resize=v_crop_resize,
                fullcrop_resize=v_fullcrop_resize, decode_only=v_decode_only, window_only=v_window_only)

def ds_for(fn):
    seeds = tf.data.Dataset.random(seed=0).batch(2, drop_remainder=True)
    ds = tf.data.Dataset.zip((tf.data.Dataset.from_tensor_slices(data).repeat(), seeds))
    return ds.map(fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False).batch(128).prefetch(4)

def rate(fn, n=12):
    it = iter(ds_for(fn))
    for _ in range(3): next(it)
    t = time.perf_counter()
    for _ in range(n): next(it)
    return n * 128 / (time.perf_counter() - t)

names = args or list(variants)
res = {k: [] for k in names}
for rep in range(3):
    for k in (names if rep % 2 == 0 else names[::-1]):
        res[k].append(rate(variants[k]))
base = statistics.median(res['full']) if 'full' in res else None
for k in names:
    m = statistics.median(res[k])
    print(f"{k:18} {m:8.0f} img/s  {m/base if base else 0:5.2f}x   {[round(v) for v in res[k]]}")

def batch_rate(n=12, parallel_iterations=None):
    seeds = tf.data.Dataset.random(seed=0).batch(2, drop_remainder=True)
    ds = tf.data.Dataset.from_tensor_slices(data).repeat().batch(128)
    ds = tf.data.Dataset.zip((ds, seeds)).map(lambda b, s: preprocess.train_batch(b, None, s, image_size=S, channels=3), num_parallel_calls=tf.data.AUTOTUNE, deterministic=False).prefetch(4)
    it = iter(ds)
    for _ in range(3): next(it)
    t = time.perf_counter()
    for _ in range(n): next(it)
    return n * 128 / (time.perf_counter() - t)
def unbatch_rate(n=12):
    seeds = tf.data.Dataset.random(seed=0).batch(2, drop_remainder=True)
    ds = tf.data.Dataset.from_tensor_slices(data).repeat().batch(128).unbatch()
    ds = tf.data.Dataset.zip((ds, seeds)).map(v_train, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False).batch(128).prefetch(4)
    it = iter(ds)
    for _ in range(3): next(it)
    t = time.perf_counter()
    for _ in range(n): next(it)
    return n * 128 / (time.perf_counter() - t)
for rep in range(3):
    print('map_fn batch', round(batch_rate()), 'per-image train', round(rate(v_train)), 'unbatch+per-image', round(unbatch_rate()), 'full', round(rate(v_full)))
