#!/usr/bin/env bash
# Install the peer gateways (smg, sglang-router: the Rust SGLang model gateway, from PyPI)
# into their own virtualenv, never the project's, so their dependencies cannot clash with
# ours. The benchmark matrix (`token-gateway bench matrix --peers ...`) starts them from here.
#
#   scripts/peers.sh [VENV_DIR]      (default: .peers-venv next to .venv)
#
# Versions are pinned so a run is reproducible; override with SMG_VERSION / SGLANG_ROUTER_VERSION.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.peers-venv}"
SMG_VERSION="${SMG_VERSION:-1.13.0}"
SGLANG_ROUTER_VERSION="${SGLANG_ROUTER_VERSION:-0.3.2}"
PYTHON="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
"$VENV/bin/python" -m pip install --quiet "smg==$SMG_VERSION" "sglang-router==$SGLANG_ROUTER_VERSION"
for exe in smg sglang-router; do
    if [ -x "$VENV/bin/$exe" ]; then echo "installed: $VENV/bin/$exe"; fi
done
"$VENV/bin/python" -m pip show smg sglang-router 2>/dev/null | grep -E '^(Name|Version):'
