#!/usr/bin/env bash
# Build (or reuse) the virtualenv that runs vLLM's own server code for the interop suite:
# vllm 0.34.0 (--no-deps, no GPU kernels), smg-grpc-servicer 0.14.1 (the VllmEngine gRPC
# servicer vLLM's `--grpc` mode starts) and the packages they import, pinned in
# vllm-requirements.txt. It lives outside the project's .venv (default
# .interop-vllm-venv, git-ignored); setup-venv.sh does the building, shared with the
# SGLang suite.
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
export VLLM_TARGET_DEVICE=cpu  # vLLM picks its CPU platform for the import check
exec bash scripts/interop/setup-venv.sh interop-vllm "vllm==0.34.0" scripts/interop/vllm-requirements.txt \
  "${1:-.interop-vllm-venv}" "${INTEROP_VLLM_MODEL_DIR:-.interop-model}" scripts/interop/setup-vllm.sh \
  vllm.entrypoints.launchers.api_server.entry vllm.entrypoints.launchers.grpc_server \
  tests.interop_vllm.standin.core
