"""Builds the package's C++ extension (guozhuang._C) and the gzrun launcher with the project's CMake.

    pip install --no-build-isolation ./python            # from the repository root
    pip wheel --no-build-isolation --no-deps ./python -w dist

The extension is compiled against the torch that the building interpreter imports: its LibTorch
(torch.utils.cmake_prefix_path, or the system's libtorch-dev for Debian's python3-torch) and its
version, which is recorded in guozhuang/_build_info.py and checked when guozhuang is imported.
Knobs (environment): GZ_CMAKE_ARGS (extra configure arguments), CMAKE_BUILD_PARALLEL_LEVEL (jobs),
GZ_PIP_BUILD_DIR (the CMake build directory instead of one under setuptools' build/; an already
configured one, e.g. the project's build/, is only built, never reconfigured), GZ_SOURCE_DIR (the
Guozhuang source tree; default: the parent of this directory).
"""
import os
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
# The package builds from the whole source tree (src/, include/, tools/), not only python/.
REPO = os.path.abspath(os.environ.get("GZ_SOURCE_DIR") or os.path.dirname(HERE))


def _jobs():
    if os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL"):
        return os.environ["CMAKE_BUILD_PARALLEL_LEVEL"]
    # LibTorch translation units need ~1.5 GiB each while compiling (as scripts/build.sh).
    try:
        with open("/proc/meminfo") as f:
            avail = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable"))
        by_mem = max(1, avail // (2 * 1024 * 1024) + 1)
    except (OSError, StopIteration):
        by_mem = 1
    return str(max(1, min(os.cpu_count() or 1, by_mem)))


def _torch_cmake_prefix():
    import torch.utils  # the interpreter running this build: its torch is the one we link

    return torch.utils.cmake_prefix_path


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        if not os.path.isfile(os.path.join(REPO, "CMakeLists.txt")):
            sys.exit(f"guozhuang: the package builds from the Guozhuang source tree; {REPO} has no CMakeLists.txt")
        build = os.environ.get("GZ_PIP_BUILD_DIR") or os.path.join(os.path.abspath(self.build_temp), "cmake")
        if not os.path.isfile(os.path.join(build, "CMakeCache.txt")):
            configure = ["cmake", "-S", REPO, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DGZ_BUILD_TESTS=OFF",
                         f"-DGZ_PYTHON_EXECUTABLE={sys.executable}", "-DGZ_PYTHON_REQUIRED=ON",
                         f"-DCMAKE_PREFIX_PATH={_torch_cmake_prefix()}"]
            configure += shlex.split(os.environ.get("GZ_CMAKE_ARGS", ""))
            subprocess.run(configure, check=True)
        subprocess.run(["cmake", "--build", build, "--target", "gz_python_ext", "gzrun", "-j", _jobs()], check=True)
        built = os.path.join(build, "python", "guozhuang")
        so = next((f for f in os.listdir(built) if f.startswith("_C.") and f.endswith(".so")), None)
        if so is None:
            sys.exit(f"guozhuang: CMake built no extension in {built}")
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(os.path.join(built, so), dest)
        pkg = os.path.dirname(dest)
        shutil.copyfile(os.path.join(built, "_build_info.py"), os.path.join(pkg, "_build_info.py"))
        os.makedirs(os.path.join(pkg, "bin"), exist_ok=True)
        gzrun = os.path.join(pkg, "bin", "gzrun")
        shutil.copyfile(os.path.join(build, "tools", "gzrun", "gzrun"), gzrun)
        os.chmod(gzrun, 0o755)


setup(ext_modules=[Extension("guozhuang._C", sources=[])], cmdclass={"build_ext": CMakeBuild})
