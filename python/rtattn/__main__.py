"""python -m rtattn ...: the rtattn CLI (precompile, info, ls, verify, prune, clear, render, bench) for hosts that
installed only the Python package. It runs the CLI program that belongs to the library this package loads: bundled
with the package (pip install), RTATTN_CLI, next to an installed librtattn (<prefix>/bin/rtattn), or on PATH."""
import os
import pathlib
import shutil
import sys


def find_cli():
    env = os.environ.get("RTATTN_CLI")
    if env:
        return env
    here = pathlib.Path(__file__).resolve().parent
    candidates = [here / "bin" / "rtattn"]
    try:
        from ._lib import lib
        libdir = pathlib.Path(lib.path).resolve().parent
        candidates += [libdir.parent / "bin" / "rtattn", libdir / "tools" / "rtattn"]  # install, build tree
    except ImportError:
        pass
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    return shutil.which("rtattn")


def main(argv):
    cli = find_cli()
    if not cli:
        sys.stderr.write("rtattn: the rtattn CLI program was not found (bundled with the package, RTATTN_CLI, "
                         "<prefix>/bin next to librtattn, or PATH)\n")
        return 2
    os.execv(cli, [cli] + argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
