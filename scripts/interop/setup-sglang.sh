#!/usr/bin/env bash
# Build (or reuse) the virtualenv that runs SGLang's own server code for the interop
# suite: sglang 0.5.23 (--no-deps, no GPU kernels), smg-grpc-servicer 0.14.1 (the
# --grpc-mode servicer) and the packages they import, pinned in sglang-requirements.txt.
# It lives outside the project's .venv (default .interop-venv, git-ignored);
# setup-venv.sh does the building, shared with the vLLM suite.
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
exec bash scripts/interop/setup-venv.sh interop-sglang "sglang==0.5.23" scripts/interop/sglang-requirements.txt \
  "${1:-.interop-venv}" "${INTEROP_SGLANG_MODEL_DIR:-.interop-model}" scripts/interop/setup-sglang.sh \
  sglang.launch_server sglang.srt.entrypoints.http_server smg_grpc_servicer.sglang.server \
  tests.interop_sglang.standin.scheduler
