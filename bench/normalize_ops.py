"""Ways to normalise a [128, 224, 224, 3] float batch per channel, in ms per image (docs/BENCHMARKS.md section 4).

    python bench/normalize_ops.py
"""
import time, tensorflow as tf
x = tf.random.uniform([128, 224, 224, 3], 0, 255)
mean = [120.0, 115.0, 100.0]; std = [60.0, 58.0, 62.0]
m = tf.constant(mean); s = tf.constant(std); a = 1.0 / s; b = -m / s
V = {
 'sub_div': tf.function(lambda x: (x - m) / s),
 'mul_add': tf.function(lambda x: x * a + b),
 'bias_add_then_mul': tf.function(lambda x: tf.nn.bias_add(x, -m) * a),
 'matmul_diag': tf.function(lambda x: tf.nn.bias_add(tf.reshape(tf.reshape(x, [-1, 3]) @ tf.linalg.diag(a), tf.shape(x)), b)),
 'per_channel': tf.function(lambda x: tf.stack([x[..., i] * a[i] + b[i] for i in range(3)], -1)),
 'tile_full': tf.function(lambda x: x * tf.reshape(tf.tile(a, [224 * 224]), [224, 224, 3]) + tf.reshape(tf.tile(b, [224 * 224]), [224, 224, 3])),
}
for k, f in V.items():
    f(x)
    t = time.perf_counter()
    for _ in range(10): y = f(x); _ = y.numpy()[0, 0, 0, 0]
    print(f"{k:18} {(time.perf_counter() - t) / 10 / 128 * 1e3:.3f} ms/image")
