"""Fixtures of the luna package's tests: the CMake build folder (LUNA_BUILD_DIR, default
<repository>/build) provides luna-translate and make_tiny_checkpoint, which writes tiny
checkpoints (tests/tiny_checkpoint.h) into a temporary folder once per session."""
import os
import pathlib
import subprocess

import pytest

import luna

ROOT = pathlib.Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def build_dir():
    d = pathlib.Path(os.environ.get("LUNA_BUILD_DIR", ROOT / "build"))
    for program in ("luna-translate", "make_tiny_checkpoint"):
        if not (d / program).exists():
            pytest.fail(f"{d / program} is missing: build it (cmake --build {d})")
    return d


@pytest.fixture(scope="session")
def checkpoints(build_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("checkpoints")
    subprocess.run([str(build_dir / "make_tiny_checkpoint"), str(d)], check=True)
    return d


@pytest.fixture(scope="session")
def run_translate(build_dir):
    """luna-translate with the arguments, on the OpenBLAS kernels of this process: stdout."""
    env = dict(os.environ, OPENBLAS_CORETYPE=luna.blas_core())

    def run(*args, stdin=None):
        r = subprocess.run([str(build_dir / "luna-translate"), *map(str, args), "--quiet"],
                           input=stdin, capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stderr
        return r.stdout

    return run
