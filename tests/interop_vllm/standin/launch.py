"""Start vLLM's own server (OpenAI HTTP, or gRPC with ``--grpc``) over the stand-in core.

The only change to vLLM is that ``EngineCoreClient.make_async_mp_client`` returns the
stand-in (``standin/core.py``) instead of starting an engine process; everything else,
argument parsing included, is vLLM's own ``main``. Runs in the interop virtualenv:

    python -m tests.interop_vllm.standin.launch [--grpc] <vllm serve arguments>
"""

from __future__ import annotations

import os
import sys

# vLLM picks its platform at import: this machine has no GPU, and the wheel is a CUDA build.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def _install_standin() -> None:
    from vllm.v1.engine.core_client import EngineCoreClient

    from tests.interop_vllm.standin.core import StandinCore

    def make_async_mp_client(vllm_config, *args, **kwargs):  # type: ignore[no-untyped-def]
        return StandinCore(vllm_config)

    EngineCoreClient.make_async_mp_client = staticmethod(make_async_mp_client)  # type: ignore[method-assign]

    # vLLM's CPU platform refuses an x86 machine without triton-cpu, which only its model
    # runner needs; the stand-in runs no model, so the check sees Triton as present.
    import vllm.triton_utils
    from vllm.platforms.cpu import CpuPlatform

    check = CpuPlatform.check_and_update_config.__func__  # type: ignore[attr-defined]

    def check_and_update_config(cls, vllm_config):  # type: ignore[no-untyped-def]
        saved, vllm.triton_utils.HAS_TRITON = vllm.triton_utils.HAS_TRITON, True
        try:
            check(cls, vllm_config)
        finally:
            vllm.triton_utils.HAS_TRITON = saved

    CpuPlatform.check_and_update_config = classmethod(check_and_update_config)  # type: ignore[method-assign]


def main() -> None:
    grpc = "--grpc" in sys.argv[1:]
    sys.argv = [sys.argv[0], *(a for a in sys.argv[1:] if a != "--grpc")]
    _install_standin()
    if grpc:
        from vllm.entrypoints.launchers.grpc_server import main as serve
    else:
        from vllm.entrypoints.launchers.api_server.entry import main as serve
    serve()


if __name__ == "__main__":
    main()
