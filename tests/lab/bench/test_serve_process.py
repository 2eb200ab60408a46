"""ServeProcess: ready line, readiness poll, clean stop of the whole process group."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import httpx
import pytest

from gateway_lab.bench.serve_process import ServeProcess

CHILD = str(Path(__file__).with_name("ready_child.py"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its parent) counts as gone
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


async def _gone(pid: int) -> bool:
    for _ in range(100):
        if not _alive(pid):
            return True
        await asyncio.sleep(0.02)
    return False


@pytest.mark.parametrize("mode", ["ok", "stubborn"])
async def test_ready_then_stop_kills_the_group(mode: str, tmp_path) -> None:
    served = await ServeProcess.launch([sys.executable, CHILD, mode], "child", log_dir=tmp_path)
    grandchild = int(served.ready_info["grandchild"])
    async with httpx.AsyncClient(trust_env=False) as client:
        assert (await client.get(served.url + "/readiness")).status_code == 200
    code = await served.stop(timeout_s=0.5)
    assert code is not None and code != 0  # SIGTERM (ok) or SIGKILL (stubborn)
    assert not _alive(served.process.pid) and await _gone(grandchild)
    served.remove_log()


async def test_exit_before_ready_reports_the_log(tmp_path) -> None:
    with pytest.raises(RuntimeError, match=r"(?s)exited before it was ready.*no workers"):
        await ServeProcess.launch([sys.executable, CHILD, "exit"], "child", log_dir=tmp_path)


async def test_never_ready_times_out_and_is_killed(tmp_path) -> None:
    t = time.perf_counter()
    with pytest.raises(RuntimeError, match=r"not ready after 0\.5s"):
        await ServeProcess.launch([sys.executable, CHILD, "hang"], "child", ready_timeout_s=0.5,
                                  log_dir=tmp_path)
    assert time.perf_counter() - t < 5


async def test_the_serve_command_line_leaves_out_what_it_is_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    async def fake_launch(argv: list[str], name: str, **_: object) -> str:
        seen.append([*argv, name])
        return name

    monkeypatch.setattr(ServeProcess, "launch", fake_launch)
    await ServeProcess.start(["grpc://a:1"], "cache_aware", extra_args=["--log-level", "warning"])
    await ServeProcess.start([], "", extra_args=["--prefill", "grpc://p:1", "--decode", "grpc://d:1"])
    assert seen[0][3:] == [
        "serve", "--worker-urls", "grpc://a:1", "--policy", "cache_aware", "--host", "127.0.0.1", "--port", "0",
        "--log-level", "warning", "gateway-cache_aware",
    ]  # fmt: skip
    assert seen[1][3:] == [
        "serve", "--host", "127.0.0.1", "--port", "0", "--prefill", "grpc://p:1", "--decode", "grpc://d:1", "gateway-serve",
    ]  # fmt: skip
