#!/usr/bin/python3
"""Write Fashion-MNIST as photo-like 3×128×128 JPEG files, an ImageFolder of ≥ 1 GB
(bench/data/shards.py; docs/benchmarks/data.md, "Sharded data sets").

Each image is a garment on a scene: a smooth colour background (a random 4×4 colour grid
resized bicubically), the 28×28 garment enlarged to 96–128 pixels (bicubic), tinted with
a random colour and placed at a random offset, sensor-like noise (Gaussian, σ = 10 grey
levels) over all, saved as JPEG quality 95. These decode and compress like photographs
(about 9 KB each, against about 1 KB for the garment centred on black), so the data set's
bytes and the decoder's work are those of real pictures of that size.

The training set is written COPIES times (default 2: 120,000 files, each copy of a garment
on its own scene), the test set once, so that the whole is over 1 GB. Every file is a
deterministic function of (seed, split, index, copy).

Layout: OUT/train/<class>/NNNNNN_C.jpg and OUT/test/<class>/NNNNNN.jpg, with
Fashion-MNIST's class names (as `dltrain dataset from-idx` names them).

Usage: bench/data/photo_fmnist.py IDX_DIR OUT [--copies 2] [--size 128] [--limit N] [--jobs 2]
Needs python3-numpy and python3-pil (Debian's, as python3-torchvision pulls in).
"""
import argparse
import gzip
import io
import multiprocessing
import os
import sys

import numpy as np
from PIL import Image

CLASSES = ["T-shirt_top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
           "Ankle_boot"]


def read_idx(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * dims).reshape(shape)


def find(idx_dir, stem):
    for name in (stem, stem + ".gz"):
        p = os.path.join(idx_dir, name)
        if os.path.exists(p):
            return p
    sys.exit("photo_fmnist: %s: no %s or %s.gz" % (idx_dir, stem, stem))


def scene(garment, rng, size):
    """One photo-like image (size×size×3 uint8) of a 28×28 garment."""
    grid = rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)
    background = np.asarray(Image.fromarray(grid).resize((size, size), Image.BICUBIC), np.float32)
    side = int(rng.integers(size * 3 // 4, size + 1))
    item = np.asarray(Image.fromarray(garment).resize((side, side), Image.BICUBIC), np.float32) / 255.0
    tint = rng.uniform(0.3, 1.0, 3).astype(np.float32) * 255.0
    ox, oy = (int(v) for v in rng.integers(0, size - side + 1, 2))
    alpha = np.zeros((size, size, 1), np.float32)
    alpha[oy:oy + side, ox:ox + side, 0] = item
    image = background * (1.0 - alpha) + alpha * tint
    image += rng.normal(0.0, 10.0, image.shape).astype(np.float32)
    return np.clip(image, 0, 255).astype(np.uint8)


def write_range(args):
    out, split, split_no, images, labels, start, stop, copies, size, seed = args
    written = 0
    for i in range(start, stop):
        for c in range(copies):
            rng = np.random.default_rng([seed, split_no, i, c])
            buf = io.BytesIO()
            Image.fromarray(scene(images[i], rng, size)).save(buf, "JPEG", quality=95)
            name = "%06d_%d.jpg" % (i, c) if copies > 1 else "%06d.jpg" % i
            with open(os.path.join(out, split, CLASSES[labels[i]], name), "wb") as f:
                f.write(buf.getvalue())
            written += len(buf.getvalue())
    return written


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("idx_dir")
    ap.add_argument("out")
    ap.add_argument("--copies", type=int, default=2, help="scenes per training image (default 2)")
    ap.add_argument("--size", type=int, default=128, help="image side in pixels (default 128)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--limit", type=int, default=0, help="the first N images of each split (0 = all)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args()
    if a.copies < 1 or a.size < 28:
        sys.exit("photo_fmnist: --copies must be >= 1 and --size >= 28")
    total = 0
    tmp = a.out + ".part"
    for split_no, (split, stem, copies) in enumerate((("train", "train", a.copies), ("test", "t10k", 1))):
        images = read_idx(find(a.idx_dir, stem + "-images-idx3-ubyte"))
        labels = read_idx(find(a.idx_dir, stem + "-labels-idx1-ubyte"))
        if len(images) != len(labels):
            sys.exit("photo_fmnist: %s: %d images but %d labels" % (split, len(images), len(labels)))
        if a.limit:
            images, labels = images[:a.limit], labels[:a.limit]
        for c in CLASSES:
            os.makedirs(os.path.join(tmp, split, c), exist_ok=True)
        step = 2000
        work = [(tmp, split, split_no, images, labels, s, min(s + step, len(images)), copies, a.size, a.seed)
                for s in range(0, len(images), step)]
        with multiprocessing.Pool(a.jobs) as pool:
            for n in pool.imap_unordered(write_range, work):
                total += n
                print("photo_fmnist: %s %.0f MB" % (split, total / 1e6), file=sys.stderr, flush=True)
    os.rename(tmp, a.out)
    print("photo_fmnist: wrote %s (%.2f GB of JPEG)" % (a.out, total / 1e9), file=sys.stderr)


if __name__ == "__main__":
    main()
