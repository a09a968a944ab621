"""Both examples (examples/python) train Fashion-MNIST at 2 ranks.

By default (CI) a shortened run: the first 15,000 training images, test accuracy >= 80%.
GZ_PY_FULL_EXAMPLES=1: the full epoch of 60,000 images and the target, >= 88% (about a minute each
on a quiet 2-core machine; the result of such a run is in docs/python.md).
"""
import os
import re

import pytest

from conftest import ROOT, gzrun

FULL = os.environ.get("GZ_PY_FULL_EXAMPLES") == "1"
EXAMPLES = os.path.join(ROOT, "examples", "python")
DATA = "/usr/share/datasets/fashion-mnist"


@pytest.mark.skipif(not os.path.isdir(DATA), reason="no Fashion-MNIST (apt-get install dataset-fashion-mnist)")
@pytest.mark.parametrize("script", ["ddp_fashion_mnist.py", "horovod_fashion_mnist.py"])
def test_example_accuracy(script):
    args = [] if FULL else ["--limit-train", "15000"]
    r = gzrun(os.path.join(EXAMPLES, script), 2, *args, timeout=900)
    assert r.returncode == 0, r
    m = re.search(r"TEST ACCURACY ([0-9.]+)%", r.out)
    assert m, r
    assert float(m.group(1)) >= (88.0 if FULL else 80.0), r
