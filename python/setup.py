"""Builds the rtattn wheel: the Python code plus librtattn, the rtattn CLI and the manifests, laid out as a prefix
inside the package (rtattn/lib, rtattn/bin, rtattn/share), so that the package finds its own library and
`python -m rtattn` its own CLI.

Where librtattn comes from:
- RTATTN_PREFIX=<prefix>: an installed librtattn (`cmake --install build --prefix <prefix>`) is bundled as is;
- RTATTN_USE_SYSTEM=1: nothing is bundled; the package loads an installed librtattn (or RTATTN_LIBRARY) at run time;
- otherwise CMake builds it from the source tree this directory belongs to (the C++ build's requirements apply:
  CUDA toolkit with NVRTC, fmt, nlohmann_json, CLI11), with the C++ runtime linked in.

The wheel is tagged py3-none-manylinux_2_<glibc>_<arch>: it needs the C runtime and, at run time, NVRTC (found as
librtattn finds it) and a CUDA driver.
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
                                   "-DRTATTN_STATIC_CXX_RUNTIME=ON", "-DCMAKE_INSTALL_LIBDIR=lib"])
            subprocess.check_call(["cmake", "--build", str(build), "-j", str(os.cpu_count() or 2)])
            subprocess.check_call(["cmake", "--install", str(build), "--prefix", str(prefix)])
            bundle(prefix, package)


class BinaryDistribution(Distribution):
    """The wheel carries a native library: tag it for the platform, not as pure Python."""

    def has_ext_modules(self):
        return True


try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1: the wheel package's
    from wheel.bdist_wheel import bdist_wheel

# What a manylinux wheel's native files may need (PEP 600): the C runtime's libraries, no others.
_MANYLINUX_LIBS = {"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "libgcc_s.so.1",
                   "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1"}


def platform_tag(files, plat: str) -> str:
    """manylinux_2_<minor>_<arch>, the newest glibc symbol version the files use, when they need nothing past the C
    runtime (the C++ runtime linked in: RTATTN_STATIC_CXX_RUNTIME); else the build machine's own tag."""
    minor = 17
    readelf = shutil.which("readelf")
    if readelf is None:  # binutils missing: nothing can be said of the files
        return plat
    for f in files:
        needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]",
                            subprocess.run([readelf, "-d", str(f)], capture_output=True, text=True).stdout)
        if set(needed) - _MANYLINUX_LIBS:
            return plat
        symbols = subprocess.run([readelf, "--dyn-syms", "-W", str(f)], capture_output=True, text=True).stdout
        minor = max([minor] + [int(m) for m in re.findall(r"@GLIBC_2\.(\d+)", symbols)])
    arch = plat.split("_", 1)[1] if plat.startswith("linux_") else None
    return f"manylinux_2_{minor}_{arch}" if arch else plat


class PortableWheel(bdist_wheel):
    """py3-none: the Python code is pure and reaches librtattn through ctypes, so one wheel serves every CPython 3;
    the platform tag says which Linux the bundled library and CLI run on."""

    def get_tag(self):
        _, _, plat = super().get_tag()
        package = pathlib.Path(self.bdist_dir)
        native = [p for p in package.rglob("*") if p.is_file() and (p.name.startswith("librtattn.so") or
                                                                      p.parent.name == "bin")]
        # RTATTN_USE_SYSTEM=1 bundles nothing native: the wheel is pure Python.
        return ("py3", "none", platform_tag(native, plat)) if native else ("py3", "none", "any")


setup(version=version(), cmdclass={"build_py": BuildWithLibrary, "bdist_wheel": PortableWheel},
      distclass=BinaryDistribution)
