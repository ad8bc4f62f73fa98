#!/usr/bin/env bash
# The main job: set up, fetch SmolLM2-135M-Instruct, build a bundle (target + int8 self-draft), generate.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
specexport fetch-smollm2 --out models/smollm2-135m
[ -f bundles/smollm2/manifest.json ] && [ "${REBUILD:-0}" = 0 ] && echo "bundles/smollm2 exists (REBUILD=1 to rebuild)" \
  || specexport build --target smollm2-135m --draft self:int8 --capacity 2048 --out bundles/smollm2 --force
specexport inspect bundles/smollm2
PROMPT="Summarize in two sentences: The quick brown fox jumps over the lazy dog. The dog, annoyed, chases the fox across the field, but the fox is faster and escapes into the forest."
for d in none ngram recycle model; do
  echo "== draft: $d"
  specexport generate bundles/smollm2 --chat --prompt "$PROMPT" --max-new-tokens 96 --draft "$d" --stats
done
