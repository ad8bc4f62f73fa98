#!/usr/bin/env bash
# Set up, then run the whole test suite (tiny random checkpoints + one real SmolLM2 build).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
python -m pytest -q -p no:cacheprovider "$@"
# On an AVX-512 CPU the suite ran the kernels' AVX-512 code; their AVX2 code (what an AVX2-only CPU runs) is
# tested too: built for Haswell's ISA, with the MatMul kernel on (by default only AVX-512 builds run it), and the
# int4 kernel's AVX2 path (an AVX512-VNNI build runs its VPDPBUSD path).
if [ $# -eq 0 ] && grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
  echo "the kernels' AVX2 build (SPECEXPORT_MARCH=haswell):"
  SPECEXPORT_MARCH=haswell SPECEXPORT_MATMUL=1 python -m pytest -q -p no:cacheprovider tests/test_kernels.py \
    tests/test_matmul_kernel.py tests/test_matmul4_kernel.py tests/test_lossless.py
fi
