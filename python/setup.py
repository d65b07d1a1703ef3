"""Builds the rtattn wheel: the Python code plus librtattn, the rtattn CLI and the manifests, laid out as a prefix
inside the package (rtattn/lib, rtattn/bin, rtattn/share), so that the package finds its own library and
`python -m rtattn` its own CLI.

Where librtattn comes from:
- RTATTN_PREFIX=<prefix>: an installed librtattn (`cmake --install build --prefix <prefix>`) is bundled as is;
- RTATTN_USE_SYSTEM=1: nothing is bundled; the package loads an installed librtattn (or RTATTN_LIBRARY) at run time;
- otherwise CMake builds it from the source tree this directory belongs to (the C++ build's requirements apply:
  CUDA toolkit with NVRTC, fmt, nlohmann_json, OpenSSL, CLI11).
"""
import os
import pathlib
import re
import shutil
import subprocess
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = pathlib.Path(__file__).resolve().parent
# The librtattn source tree; RTATTN_SOURCE_DIR when this directory was copied elsewhere (the packaging test does).
SOURCE = pathlib.Path(os.environ.get("RTATTN_SOURCE_DIR", HERE.parent)).resolve()


def version():
    text = (SOURCE / "CMakeLists.txt").read_text()
    return re.search(r"project\(rtattn VERSION ([0-9.]+)", text).group(1)


def bundle(prefix: pathlib.Path, package: pathlib.Path):
    """Copies what the package needs from an install prefix."""
    libs = sorted(p for d in ("lib", "lib64") for p in (prefix / d).glob("librtattn.so*"))
    if not libs:
        raise SystemExit(f"rtattn setup: no librtattn.so under {prefix}/lib: is it an rtattn install prefix?")
    (package / "lib").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(libs[0].resolve(), package / "lib" / "librtattn.so")
    cli = prefix / "bin" / "rtattn"
    if cli.exists():
        (package / "bin").mkdir(exist_ok=True)
        shutil.copy2(cli, package / "bin" / "rtattn")
    manifests = prefix / "share" / "rtattn" / "manifests"
    if manifests.is_dir():
        shutil.copytree(manifests, package / "share" / "rtattn" / "manifests", dirs_exist_ok=True)


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        if os.environ.get("RTATTN_USE_SYSTEM") == "1":
            return
        package = pathlib.Path(self.build_lib) / "rtattn"
        if os.environ.get("RTATTN_PREFIX"):
            bundle(pathlib.Path(os.environ["RTATTN_PREFIX"]), package)
            return
        with tempfile.TemporaryDirectory() as tmp:
            build, prefix = pathlib.Path(tmp) / "build", pathlib.Path(tmp) / "prefix"
            subprocess.check_call(["cmake", "-S", str(SOURCE), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                                   "-DRTATTN_BUILD_TESTS=OFF", "-DRTATTN_BUILD_TOOLS=ON",
                                   "-DCMAKE_INSTALL_LIBDIR=lib"])
            subprocess.check_call(["cmake", "--build", str(build), "-j", str(os.cpu_count() or 2)])
            subprocess.check_call(["cmake", "--install", str(build), "--prefix", str(prefix)])
            bundle(prefix, package)


class BinaryDistribution(Distribution):
    """The wheel carries a native library: tag it for the platform, not as pure Python."""

    def has_ext_modules(self):
        return True


setup(version=version(), cmdclass={"build_py": BuildWithLibrary}, distclass=BinaryDistribution)
