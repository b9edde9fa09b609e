"""The reference tests' PyTorch requirement: run under a python3 that has torch and numpy, or
report the test skipped (exit 77, which ctest shows as such)."""
import os
import subprocess
import sys


def require(script):
    """Return when torch and numpy import; else re-run `script` under Debian's /usr/bin/python3
    (where tools/ci/install-deps.sh --reference puts python3-torch) if that one has them, or exit 77."""
    try:
        import numpy  # noqa: F401
        import torch  # noqa: F401
        return
    except ImportError:
        pass
    system = "/usr/bin/python3"
    if os.path.exists(system) and os.path.realpath(sys.executable) != os.path.realpath(system) \
            and subprocess.run([system, "-c", "import torch, numpy"], capture_output=True).returncode == 0:
        os.execv(system, [system, os.path.abspath(script)] + sys.argv[1:])
    print("SKIPPED: PyTorch is not installed (tools/ci/install-deps.sh --reference installs python3-torch)")
    sys.exit(77)
