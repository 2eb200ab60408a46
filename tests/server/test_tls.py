"""TLS on the gateway's own HTTP and gRPC ports, plain and mutual (certificates made here)."""

from __future__ import annotations

import asyncio
import json
import signal
import ssl
import sys
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.server.tls import FrontTlsConfig, TlsConfigError
from tests.e2e.http.certs import make_pki


def test_config_checks(tmp_path: Path) -> None:
    FrontTlsConfig().check()
    with pytest.raises(TlsConfigError, match="go together"):
        FrontTlsConfig(tls_cert_file="c").check()
    with pytest.raises(TlsConfigError, match="needs"):
        FrontTlsConfig(tls_client_ca_file="ca").check()
    with pytest.raises(TlsConfigError, match="does not exist"):
        FrontTlsConfig(tls_cert_file=str(tmp_path / "c"), tls_key_file=str(tmp_path / "k")).check()
    assert FrontTlsConfig().uvicorn_kwargs() == {} and FrontTlsConfig().grpc_credentials() is None


@pytest.mark.slow
async def test_https_and_grpc_tls_with_client_certificates(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    (tmp_path / "server.pem").write_bytes(pki.server.cert)
    (tmp_path / "server.key").write_bytes(pki.server.key)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", "0", "--grpc-port", "0",
        "--tls-cert-file", str(tmp_path / "server.pem"), "--tls-key-file", str(tmp_path / "server.key"),
        "--tls-client-ca-file", pki.ca_file, "--tokenizer-cache-dir", str(tmp_path / "tok"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL,
    )
    try:
        async with asyncio.timeout(60):
            line = await proc.stdout.readline()  # type: ignore[union-attr]
        assert line, (await proc.stderr.read()).decode()  # type: ignore[union-attr]
        ready = json.loads(line)
        assert ready["url"].startswith("https://127.0.0.1:")
        with_cert = ssl.create_default_context(cafile=pki.ca_file)
        with_cert.load_cert_chain(pki.client_cert_file, pki.client_key_file)
        async with httpx.AsyncClient(verify=with_cert, timeout=10) as http:
            assert (await http.get(ready["url"] + "/health")).status_code == 200
        no_cert = ssl.create_default_context(cafile=pki.ca_file)
        async with httpx.AsyncClient(verify=no_cert, timeout=10) as http:
            with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
                await http.get(ready["url"] + "/health")
        async with httpx.AsyncClient(timeout=10) as http:  # plain HTTP on the TLS port
            with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError, httpx.ConnectError)):
                await http.get(ready["url"].replace("https", "http") + "/health")

        target = f"127.0.0.1:{ready['grpc_port']}"
        creds = grpc.ssl_channel_credentials(pki.ca.cert, pki.client.key, pki.client.cert)
        async with grpc.aio.secure_channel(target, creds) as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert reply.status in (health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING)
        async with grpc.aio.secure_channel(target, grpc.ssl_channel_credentials(pki.ca.cert)) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        async with grpc.aio.insecure_channel(target) as channel:
            with pytest.raises(grpc.aio.AioRpcError):
                await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(30):
                await proc.wait()
    assert proc.returncode == 0


async def test_missing_key_file_exits_2(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", "--port", "0", "--tls-cert-file", str(tmp_path / "nope.pem"),
        "--tls-key-file", str(tmp_path / "nope.key"), "--tokenizer-cache-dir", str(tmp_path / "tok"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL,
    )
    async with asyncio.timeout(60):
        _, err = await proc.communicate()
    assert proc.returncode == 2 and b"does not exist" in err
