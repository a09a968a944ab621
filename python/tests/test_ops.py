"""Every op of the "gz" backend, every dtype and reduce op, against Gloo (and a local reference)."""
import pytest

from conftest import gzrun


@pytest.mark.parametrize("world", [2, 3])
def test_ops_match_gloo(world):
    r = gzrun("ops_vs_gloo.py", world)
    assert r.returncode == 0, r
    assert "OPS OK" in r.out, r


@pytest.mark.parametrize("world", [2, 3])
def test_sequence_numbers(world):
    r = gzrun("seq_numbers.py", world, "count")
    assert r.returncode == 0, r
    assert "SEQ OK" in r.out, r


def test_object_collectives_on_subgroup_under_debug_wrapper():
    # torch 2.x's TORCH_DISTRIBUTED_DEBUG=DETAIL wrapper needs the backend's sequence numbers.
    r = gzrun("seq_numbers.py", 2, "detail", extra_env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    assert r.returncode == 0, r
    assert "SEQ OK" in r.out, r
