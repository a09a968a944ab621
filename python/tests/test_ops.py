"""Every op of the "gz" backend, every dtype and reduce op, against Gloo (and a local reference)."""
import pytest

from conftest import gzrun


@pytest.mark.parametrize("world", [2, 3])
def test_ops_match_gloo(world):
    r = gzrun("ops_vs_gloo.py", world)
    assert r.returncode == 0, r
    assert "OPS OK" in r.out, r
