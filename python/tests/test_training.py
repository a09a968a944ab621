"""DDP on "gz" and guozhuang.torch (Horovod mode) train exactly as DDP on Gloo."""
import pytest

from conftest import gzrun


@pytest.mark.parametrize("world", [2, 3])
def test_ddp_and_horovod_match_gloo(world):
    r = gzrun("ddp_horovod.py", world)
    assert r.returncode == 0, r
    assert "TRAIN OK" in r.out, r
