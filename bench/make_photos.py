"""Real-sized benchmark photos: ~400x350 JPEGs of ~80 KB, with texture and noise, in 10 class folders."""

import argparse
import os
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from PIL import Image


_BASES = {}


def _base(k: int) -> np.ndarray:
    """One of 16 smooth 480x420 scenes (soft blobs of colour plus texture), made once per process."""
    if k not in _BASES:
        rng = np.random.default_rng(10_000 + k)
        y, x = np.mgrid[0:420, 0:480].astype(np.float32)
        image = np.zeros((420, 480, 3), np.float32)
        for _ in range(6):
            cx, cy, r = rng.uniform(0, 480), rng.uniform(0, 420), rng.uniform(40, 200)
            image += np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / (2 * r * r))[..., None] * rng.uniform(0, 255, 3)
        image += 30 * np.sin(x[..., None] / rng.uniform(3, 12) + rng.uniform(0, 6, 3))
        _BASES[k] = image
    return _BASES[k]


def photo(index: int, noise: float = 22.0, quality: int = 95) -> bytes:
    """One photo-like JPEG: a random crop of a scene, a colour shift and sensor noise, seeded by index."""
    import io

    rng = np.random.default_rng(index)
    width, height = int(rng.integers(360, 440)), int(rng.integers(320, 380))
    base = _base(int(rng.integers(16)))
    top, left = int(rng.integers(0, 420 - height + 1)), int(rng.integers(0, 480 - width + 1))
    image = base[top : top + height, left : left + width] * rng.uniform(0.7, 1.2, 3) + rng.normal(0, noise, (height, width, 3))
    buf = io.BytesIO()
    Image.fromarray(np.clip(image, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def _write(args):
    folder, index = args
    path = os.path.join(folder, f"class_{index % 10}", f"img_{index:06d}.jpg")
    with open(path, "wb") as f:
        f.write(photo(index))
    return os.path.getsize(path)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("folder")
    parser.add_argument("--count", type=int, default=5000)
    args = parser.parse_args(argv)
    for c in range(10):
        os.makedirs(os.path.join(args.folder, f"class_{c}"), exist_ok=True)
    with ProcessPoolExecutor() as pool:
        sizes = list(pool.map(_write, [(args.folder, i) for i in range(args.count)], chunksize=64))
    print(f"wrote {len(sizes)} photos, {sum(sizes) / 1e6:.0f} MB, {sum(sizes) / len(sizes) / 1e3:.0f} KB each")


if __name__ == "__main__":
    main()
