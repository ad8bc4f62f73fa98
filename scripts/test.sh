#!/usr/bin/env bash
# Set up, then run the whole test suite (tiny random checkpoints + one real SmolLM2 build).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
python -m pytest -q -p no:cacheprovider "$@"
