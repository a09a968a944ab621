"""The package as users get it: import rules, the torch-version guard, and `pip wheel` + install + gzrun
from the installed package (no build tree on the path)."""
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from conftest import BUILD, PYTHON, ROOT, env

PKG = os.path.join(BUILD, "python", "guozhuang")


def py(code, e=None, cwd=None, timeout=120):
    p = subprocess.run([PYTHON, "-c", code], env=e or env(), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=timeout)
    return p.returncode, p.stdout


def test_backend_lookup_after_importing_guozhuang_torch(tmp_path):
    # `import guozhuang.torch` binds the package attribute `torch`, i.e. guozhuang/__init__.py's global
    # of that name: a global `torch` meaning the real torch then pointed at Horovod's API (on torch 2.x
    # "module 'guozhuang.torch' has no attribute 'device'" from every DDP/Horovod worker).
    code = f"""
import torch, torch.distributed as dist
import guozhuang, guozhuang.torch
class NotGz:  # a torch 2.x ProcessGroup whose CPU backend is not ours
    def _get_backend(self, device):
        assert isinstance(device, torch.device), device
        return object()
try:
    guozhuang.comm_backend(NotGz())
except ValueError as e:
    print("REFUSED", e)
dist.init_process_group("gz", init_method="file://{tmp_path}/store", rank=0, world_size=1)
print("BACKEND", guozhuang.comm_backend())
"""
    rc, out = py(code)
    assert rc == 0, out
    assert 'REFUSED not a process group of backend "gz"' in out, out
    assert "BACKEND " in out, out


def test_torch_version_mismatch_is_a_clear_import_error(tmp_path):
    # A copy of the built package that says it was built against another torch.
    shutil.copytree(PKG, tmp_path / "guozhuang")
    rc, out = py("import guozhuang; print('IMPORTED')", e=env(PYTHONPATH=tmp_path))
    assert rc == 0 and "IMPORTED" in out, out  # the copy itself is fine
    info = tmp_path / "guozhuang" / "_build_info.py"
    info.write_text(info.read_text().replace("TORCH_VERSION = ", "TORCH_VERSION = '0.0.1' or "))
    rc, out = py("import guozhuang", e=env(PYTHONPATH=tmp_path))
    assert rc == 1, out  # an exception, not a crash (a signal gives a negative status)
    assert "ImportError: guozhuang was built against torch 0.0.1 but this Python imports torch" in out, out
    assert "rebuild it with this interpreter" in out, out


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """`pip wheel` of python/ built from the already-built tree (GZ_PIP_BUILD_DIR), in a copy of
    python/ so that setuptools' build/ and egg-info stay out of the source tree."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "python"
    shutil.copytree(os.path.join(ROOT, "python"), src, ignore=shutil.ignore_patterns("tests", "__pycache__", "build"))
    e = env(GZ_SOURCE_DIR=ROOT, GZ_PIP_BUILD_DIR=BUILD)
    e.pop("PYTHONPATH")
    p = subprocess.run([PYTHON, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "--no-index", "-w",
                        str(tmp / "dist"), str(src)], env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-6000:]
    wheels = list((tmp / "dist").glob("guozhuang-*.whl"))
    assert len(wheels) == 1, p.stdout[-3000:]
    return wheels[0]


def test_wheel_contents(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = {i.filename: i for i in z.infolist()}
        entry_points = next(z.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert any(n.startswith("guozhuang/_C.") and n.endswith(".so") for n in names), sorted(names)
    for n in ("guozhuang/__init__.py", "guozhuang/_build_info.py", "guozhuang/run.py", "guozhuang/torch/__init__.py"):
        assert n in names, sorted(names)
    gzrun = names["guozhuang/bin/gzrun"]
    assert (gzrun.external_attr >> 16) & 0o111, oct(gzrun.external_attr >> 16)  # stays executable
    assert "gzrun = guozhuang.run:main" in entry_points, entry_points


def test_installed_package_runs_under_its_gzrun(wheel, tmp_path):
    venv = tmp_path / "venv"
    # --system-site-packages: the interpreter's torch (and Debian's pip); --without-pip: no ensurepip.
    subprocess.run([PYTHON, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    vpy = str(venv / "bin" / "python")
    e = env()
    e.pop("PYTHONPATH")  # nothing from the build tree
    p = subprocess.run([vpy, "-m", "pip", "install", "--no-deps", "--no-index", str(wheel)], env=e,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-4000:]
    script = tmp_path / "allreduce.py"
    script.write_text("""
import torch, torch.distributed as dist, guozhuang
dist.init_process_group("gz")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print(f"INSTALLED OK rank={dist.get_rank()} sum={t.item():g} from={guozhuang.__file__}", flush=True)
""")
    for launcher in ([str(venv / "bin" / "gzrun")], [vpy, "-m", "guozhuang.run"]):
        p = subprocess.run([*launcher, "--nproc-per-node", "2", vpy, str(script)], env=e, cwd=tmp_path,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
        assert p.returncode == 0, p.stdout[-4000:]
        for r in range(2):
            assert f"INSTALLED OK rank={r} sum=3 from={venv}" in p.stdout, p.stdout[-4000:]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
