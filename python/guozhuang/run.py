"""gzrun, the launcher, from the installed package: ``python -m guozhuang.run ARGS`` or the ``gzrun``
command pip installs. Both run the gzrun binary built with the package (guozhuang/bin/gzrun) with the
same arguments, e.g. ``gzrun --nproc-per-node 2 python3 train.py``; see ``gzrun --help``.
"""
import os
import sys


def binary():
    """Path of the gzrun binary shipped in this package (in a build tree: the one CMake built)."""
    here = os.path.dirname(os.path.abspath(__file__))
    for path in (os.path.join(here, "bin", "gzrun"),  # installed package (setup.py puts it there)
                 os.path.join(here, "..", "..", "tools", "gzrun", "gzrun")):  # build/python/guozhuang
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return os.path.normpath(path)
    raise FileNotFoundError(f"gzrun: no gzrun binary next to {here} (the package was installed without it?)")


def main(argv=None):
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        exe = binary()
    except FileNotFoundError as e:
        print(e, file=sys.stderr)
        return 127
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(exe, [exe, *args])  # gzrun replaces this process: signals and exit status are its own


if __name__ == "__main__":
    sys.exit(main())
