"""Fashion-MNIST from the IDX files of Debian's dataset-fashion-mnist package (gzip'd, big-endian
headers), as torch datasets: images scaled to [0, 1] and normalised, labels as int64."""
import gzip
import os
import struct

import numpy as np
import torch
from torch.utils.data import TensorDataset

DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860, 0.3530


def read_idx(path):
    """An IDX file (plain or gzip'd) as a numpy array of unsigned bytes."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        zero, dtype, dims = struct.unpack(">HBB", f.read(4))
        if zero != 0 or dtype != 0x08:
            raise ValueError(f"{path}: not an IDX file of unsigned bytes")
        shape = struct.unpack(">" + "I" * dims, f.read(4 * dims))
        data = np.frombuffer(f.read(), dtype=np.uint8)
    if data.size != int(np.prod(shape)):
        raise ValueError(f"{path}: {data.size} bytes of data for shape {shape}")
    return data.reshape(shape)


def load(split, root=DEFAULT_DIR, limit=None):
    """split: "train" (60,000 images) or "t10k" (10,000). limit: keep the first N."""
    def path(kind):
        p = os.path.join(root, f"{split}-{kind}-idx{3 if kind == 'images' else 1}-ubyte")
        return p if os.path.exists(p) else p + ".gz"

    try:
        images, labels = read_idx(path("images")), read_idx(path("labels"))
    except FileNotFoundError as e:
        raise SystemExit(f"{e}: install Debian's dataset-fashion-mnist or pass --data DIR") from None
    if limit:
        images, labels = images[:limit], labels[:limit]
    x = (torch.from_numpy(images.copy()).float().div_(255).sub_(MEAN).div_(STD)).unsqueeze(1)
    return TensorDataset(x, torch.from_numpy(labels.astype(np.int64)))
