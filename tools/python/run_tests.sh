#!/usr/bin/env bash
# Build the luna package into a venv under a CMake build folder and run its pytest tests (the
# CTest test python_package; tools/python/tests/conftest.py).
#
#   tools/python/run_tests.sh BUILD_DIR [PYTHON]
#
# BUILD_DIR must have built luna_shared, luna-translate and make_tiny_checkpoint; the package is
# compiled against its libluna (LUNA_BUILD_DIR, tools/python/setup.py). The venv
# (BUILD_DIR/python-venv, reused when present) sees the system's packages, so pytest and wheel
# come from apt (tools/ci/install-deps.sh); a Python without them gets them from PyPI, once.
set -euo pipefail
build="$(cd "$1" && pwd)"
python="${2:-python3}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$build/python-venv"
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv --system-site-packages "$venv"
fi
if ! "$venv/bin/python" -c "import pytest, wheel, setuptools" 2> /dev/null; then
  "$venv/bin/pip" install -q pytest wheel setuptools
fi
# pip builds the folder in place: setuptools' build/ and egg-info stay in tools/python (ignored).
LUNA_BUILD_DIR="$build" "$venv/bin/pip" install -q --no-build-isolation --no-deps \
  --disable-pip-version-check "$here"
cd "$build"
LUNA_BUILD_DIR="$build" exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$here/tests"
