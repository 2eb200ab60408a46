"""The Dockerfile and compose file, checked without a Docker engine (none runs here):
the image's command and environment start a working gateway whose HEALTHCHECK passes,
and every compose command parses with token-gateway's CLI."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml

from gateway.cli import build_parser

DOCKER = Path(__file__).resolve().parents[2] / "deploy" / "docker"


def _instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n\s*", " ", (DOCKER / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _env() -> dict[str, str]:
    env: dict[str, str] = {}
    for word, rest in _instructions():
        if word == "ENV":
            for pair in re.findall(r"(\w+)=(\S+)", rest):
                env[pair[0]] = pair[1]
    return env


def test_slim_non_root_image() -> None:
    ins = _instructions()
    froms = [rest for word, rest in ins if word == "FROM"]
    assert all("-slim" in f for f in froms)
    user = [rest for word, rest in ins if word == "USER"][-1]
    assert not user.startswith(("0", "root"))
    health = next(rest for word, rest in ins if word == "HEALTHCHECK")
    assert "/health" in health
    assert json.loads(next(rest for word, rest in ins if word == "ENTRYPOINT")) == ["token-gateway"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_image_command_serves_and_its_healthcheck_passes(tmp_path: Path) -> None:
    ins = _instructions()
    cmd = json.loads(next(rest for word, rest in ins if word == "CMD"))
    health = json.loads(next(rest for word, rest in ins if word == "HEALTHCHECK").split("CMD", 1)[1])
    base = {k: v for k, v in os.environ.items() if not k.startswith("TOKEN_GATEWAY_")}
    env = {**base, **_env(), "TOKEN_GATEWAY_HOST": "127.0.0.1", "TOKEN_GATEWAY_PORT": str(_free_port()),
           "TOKEN_GATEWAY_GRPC_PORT": str(_free_port()), "TOKEN_GATEWAY_PROMETHEUS_PORT": str(_free_port()),
           "TOKEN_GATEWAY_TOKENIZER_CACHE_DIR": str(tmp_path / "tok"), "TOKEN_GATEWAY_ADMIN_API_KEY": "k"}
    # as in the image: host 0.0.0.0 and no key is refused (admin endpoints would be open)
    refused = subprocess.run([sys.executable, "-m", "gateway", *cmd], env={**env, "TOKEN_GATEWAY_HOST": "0.0.0.0",
                             "TOKEN_GATEWAY_ADMIN_API_KEY": ""}, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "admin" in refused.stderr
    proc = subprocess.Popen([sys.executable, "-m", "gateway", *cmd], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
        assert ready["event"] == "ready" and "grpc_port" in ready and "metrics_url" in ready
        deadline = time.monotonic() + 10
        while True:
            check = subprocess.run([sys.executable if a == "python" else a for a in health], env=env, timeout=30)
            if check.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert check.returncode == 0
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert proc.returncode == 0


def test_compose_commands_parse() -> None:
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = compose["services"]
    assert {"worker-1", "worker-2", "gateway"} <= set(services)
    parser = build_parser()
    for svc in services.values():
        args = parser.parse_args(svc["command"])
        if args.command == "serve":
            for url in args.worker_urls:
                assert url.split("//")[1].split(":")[0] in services, url
            assert set(svc["depends_on"]) == {"worker-1", "worker-2"}
    assert "TOKEN_GATEWAY_ADMIN_API_KEY" in services["gateway"]["environment"]
