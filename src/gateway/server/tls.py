"""TLS on the gateway's own front doors (HTTP and gRPC), optionally mutual.

One certificate and key serve both ports. With ``--tls-client-ca-file`` every client
must present a certificate signed by that CA (mutual TLS) on both doors; API keys,
if configured, are still checked on top.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.settings import option


class TlsConfigError(ValueError):
    """TLS files missing, unreadable or given without their partner."""


@dataclass
class FrontTlsConfig:
    tls_cert_file: str | None = option(None, "PEM certificate (chain) of the gateway's HTTP and gRPC ports: serve https/TLS")
    tls_key_file: str | None = option(None, "PEM private key of --tls-cert-file")
    tls_client_ca_file: str | None = option(None, "CA bundle clients' certificates must chain to (mutual TLS on both ports)")

    @property
    def enabled(self) -> bool:
        return bool(self.tls_cert_file)

    def check(self) -> None:
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise TlsConfigError("--tls-cert-file and --tls-key-file go together")
        if self.tls_client_ca_file and not self.tls_cert_file:
            raise TlsConfigError("--tls-client-ca-file needs --tls-cert-file and --tls-key-file")
        for flag, path in (("--tls-cert-file", self.tls_cert_file), ("--tls-key-file", self.tls_key_file),
                           ("--tls-client-ca-file", self.tls_client_ca_file)):
            if path and not Path(path).is_file():
                raise TlsConfigError(f"{flag} {path!r} does not exist")

    def uvicorn_kwargs(self) -> dict[str, Any]:
        """Arguments for ``uvicorn.Config`` (empty without TLS)."""
        if not self.enabled:
            return {}
        out: dict[str, Any] = {"ssl_certfile": self.tls_cert_file, "ssl_keyfile": self.tls_key_file}
        if self.tls_client_ca_file:
            out["ssl_ca_certs"] = self.tls_client_ca_file
            out["ssl_cert_reqs"] = ssl.CERT_REQUIRED
        return out

    def grpc_credentials(self) -> Any:
        """``grpc.ServerCredentials`` for ``add_secure_port`` (None without TLS)."""
        if not self.enabled:
            return None
        import grpc

        assert self.tls_cert_file and self.tls_key_file
        chain = (Path(self.tls_key_file).read_bytes(), Path(self.tls_cert_file).read_bytes())
        roots = Path(self.tls_client_ca_file).read_bytes() if self.tls_client_ca_file else None
        return grpc.ssl_server_credentials([chain], root_certificates=roots, require_client_auth=roots is not None)
