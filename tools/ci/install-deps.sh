#!/usr/bin/env bash
# Install every system dependency of luna on a Debian machine (apt-get).
# Idempotent: when everything is present it only checks and returns (≈1 s).
#
#   tools/ci/install-deps.sh              build, test and run dependencies
#   tools/ci/install-deps.sh --reference  also python3-torch (tools/scripts/convert-checkpoint.py and
#                                         its test convert_checkpoint; regenerating the PyTorch oracle
#                                         fixtures)
#   tools/ci/install-deps.sh --mpi        also OpenMPI (the LUNA_MPI build option)
#   tools/ci/install-deps.sh --fuzz       also clang with libFuzzer and libomp (tools/ci/fuzz.sh)
#   tools/ci/install-deps.sh --browser    also chromium (luna-serve's web page test, serve_browser)
#   tools/ci/install-deps.sh --onednn     also oneDNN (bench-int8 compares its int8 matmul)
set -euo pipefail

packages=(
  build-essential cmake pkg-config           # toolchain (cmake >= 3.25 on Debian 12)
  libopenblas-dev                            # GEMM
  check libsubunit-dev                       # unit tests (Check links subunit)
  libsentencepiece-dev sentencepiece         # BPE (data/)
  python3 python3-venv                       # sacreBLEU venv for evaluation
  python3-dev python3-setuptools python3-wheel python3-pytest  # the Python package (tools/python)
  libmicrohttpd-dev                          # luna-serve's HTTP (without it luna-serve is not built)
)
for arg in "$@"; do
  case "$arg" in
    --reference) packages+=(python3-torch python3-numpy) ;;
    --mpi) packages+=(libopenmpi-dev openmpi-bin) ;;
    --fuzz) packages+=(clang libclang-rt-dev libomp-dev) ;;
    --browser) packages+=(chromium) ;;
    --onednn) packages+=(libdnnl-dev) ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "install-deps.sh: unknown option '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
