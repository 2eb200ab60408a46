"""TLS on the front doors (server/tls.py): files that go together, and the settings handed
to uvicorn and to grpc."""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path

import grpc
import pytest

from gateway.server.tls import FrontTlsConfig, TlsConfigError


def _files(tmp_path: Path) -> tuple[str, str]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost"],
        check=True, capture_output=True,
    )
    return str(cert), str(key)


def test_without_a_certificate_tls_is_off() -> None:
    config = FrontTlsConfig()
    config.check()
    assert not config.enabled and config.uvicorn_kwargs() == {} and config.grpc_credentials() is None


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"tls_cert_file": "c.pem"}, "go together"),
        ({"tls_key_file": "k.pem"}, "go together"),
        ({"tls_client_ca_file": "ca.pem"}, "needs --tls-cert-file"),
        ({"tls_cert_file": "/nonexistent/c.pem", "tls_key_file": "/nonexistent/k.pem"}, "does not exist"),
    ],
)
def test_misconfigured_files_are_refused(fields: dict[str, str], match: str) -> None:
    with pytest.raises(TlsConfigError, match=match):
        FrontTlsConfig(**fields).check()


def test_server_settings_with_and_without_client_certificates(tmp_path: Path) -> None:
    cert, key = _files(tmp_path)
    plain = FrontTlsConfig(tls_cert_file=cert, tls_key_file=key)
    plain.check()
    assert plain.uvicorn_kwargs() == {"ssl_certfile": cert, "ssl_keyfile": key}
    assert isinstance(plain.grpc_credentials(), grpc.ServerCredentials)
    mutual = FrontTlsConfig(tls_cert_file=cert, tls_key_file=key, tls_client_ca_file=cert)
    mutual.check()
    kwargs = mutual.uvicorn_kwargs()
    assert kwargs["ssl_ca_certs"] == cert and kwargs["ssl_cert_reqs"] == ssl.CERT_REQUIRED
    assert isinstance(mutual.grpc_credentials(), grpc.ServerCredentials)
