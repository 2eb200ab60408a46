#!/usr/bin/env bash
# Create (or reuse) the project's virtualenv in .venv and install token-gateway
# into it with the extras asked for. Re-installs only when pyproject.toml or the
# extras changed, so repeated runs cost a second.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-test,demo}"
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
stamp=".venv/.install-stamp"
want="$(sha256sum pyproject.toml | cut -d' ' -f1) $extras"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[${extras}]"
  echo "$want" > "$stamp"
fi
