"""Build the luna package: the C extension luna._luna against libluna (the repository's shared
library, decoding/api/luna.h), which is copied into the package next to it.

libluna comes from LUNA_BUILD_DIR, a CMake build folder of this repository that has built the
luna_shared target (the test suite uses build/), or else is built here with CMake in
<repository>/build-python/ (Release, no tests). pip builds a local folder in place, so
`pip install tools/python` from a checkout works after tools/ci/install-deps.sh.
"""
import os
import pathlib
import re
import shutil
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def project_version():
    text = (ROOT / "CMakeLists.txt").read_text()
    return re.search(r"project\(luna VERSION ([0-9.]+)", text).group(1)


def libluna_dir():
    """A folder with libluna.so (building it when LUNA_BUILD_DIR is not given)."""
    given = os.environ.get("LUNA_BUILD_DIR")
    if given:
        d = pathlib.Path(given).resolve()
        if not (d / "libluna.so").exists():
            raise SystemExit(f"luna: LUNA_BUILD_DIR={given} has no libluna.so "
                             f"(cmake --build {given} --target luna_shared)")
        return d
    d = ROOT / "build-python"
    jobs = str(os.cpu_count() or 2)
    subprocess.check_call(["cmake", "-S", str(ROOT), "-B", str(d), "-DCMAKE_BUILD_TYPE=Release",
                           "-DLUNA_BUILD_TESTS=OFF"])
    subprocess.check_call(["cmake", "--build", str(d), "--target", "luna_shared", "-j", jobs])
    return d


class BuildWithLibluna(build_ext):
    def run(self):
        lib = libluna_dir()
        for ext in self.extensions:
            ext.library_dirs.append(str(lib))
        super().run()
        # the extension needs libluna by its SONAME, found next to it ($ORIGIN)
        soname = sorted(p for p in lib.glob("libluna.so.*") if p.name.count(".") == 2)[0]
        dest = pathlib.Path(self.build_lib) / "luna"
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy2(soname.resolve(), dest / soname.name)
        if self.inplace:
            shutil.copy2(soname.resolve(), HERE / "luna" / soname.name)


setup(
    version=project_version(),
    ext_modules=[Extension("luna._luna", ["luna/_luna.c"],
                           include_dirs=[str(ROOT / "decoding" / "api")], libraries=["luna"],
                           runtime_library_dirs=["$ORIGIN"],
                           extra_compile_args=["-std=c11", "-Wall", "-Wextra"])],
    cmdclass={"build_ext": BuildWithLibluna},
)
