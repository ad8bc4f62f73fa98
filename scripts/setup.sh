#!/usr/bin/env bash
# Set up .venv with the exporter, runtime and test dependencies. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
# torch first and pinned: on these machines 2.13.0 is a CPU build on local disk; unpinned pulls a CUDA build
python -m pip install -q torch==2.13.0 2>&1 | grep -v '^WARNING: Location' || true
# ray = the serve extra + Ray Serve (tests/test_serve.py, tests/test_serve_ray.py); openvino = the OpenVINO backend
# (tests/test_ov_backend.py)
python -m pip install -q -e ".[build,test,ray,openvino]" 2>&1 | grep -v '^WARNING: Location' || true
python -c "import torch, transformers, onnxruntime, tokenizers; print('set up: torch', torch.__version__, '| transformers', transformers.__version__, '| onnxruntime', onnxruntime.__version__)"
