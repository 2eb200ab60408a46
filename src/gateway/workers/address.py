"""Where a worker is: its URL checked and spelled one way (``grpc://host:port``).

gRPC workers are ``grpc://`` / ``grpcs://``; HTTP workers (SGLang's or vLLM's HTTP
server) are ``http://`` / ``https://``. The scheme picks the transport; what answers
there picks the engine (``workers/connect.py``).

Apart from the client so the transport interface (``workers/transport.py``) and
every implementation can name an address without importing the gRPC client.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlparse


class BadWorkerUrl(ValueError):
    """A worker URL that is not scheme://host:port with a scheme of WORKER_SCHEMES."""


WORKER_SCHEMES = ("grpc", "grpcs", "http", "https")
HTTP_SCHEMES = frozenset(("http", "https"))


@dataclass(frozen=True, slots=True)
class WorkerAddress:
    scheme: str  # one of WORKER_SCHEMES
    host: str
    port: int

    @property
    def target(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.target}"

    @property
    def is_http(self) -> bool:
        """Served over HTTP/1.1 (an engine's HTTP server), not gRPC."""
        return self.scheme in HTTP_SCHEMES


def parse_worker_url(url: str) -> WorkerAddress:
    """Accept only grpc://, grpcs://, http:// and https:// URLs with an explicit host and port."""
    parsed = urlparse(url.strip())
    if parsed.scheme not in WORKER_SCHEMES:
        raise BadWorkerUrl(
            f"worker URL must start with grpc://, grpcs://, http:// or https://, got {url!r}"
        )
    try:
        port = parsed.port
    except ValueError:
        raise BadWorkerUrl(f"worker URL has a port outside 1-65535: {url!r}") from None
    if not parsed.hostname or port is None:
        raise BadWorkerUrl(f"worker URL needs a host and a port: {url!r}")
    if not 0 < port < 65536:
        raise BadWorkerUrl(f"worker URL has a port outside 1-65535: {url!r}")
    if parsed.path not in ("", "/") or parsed.query or parsed.fragment or parsed.username:
        raise BadWorkerUrl(f"worker URL must be scheme://host:port only: {url!r}")
    return WorkerAddress(parsed.scheme, canonical_host(parsed.hostname, parsed.scheme), port)


def canonical_host(host: str, scheme: str) -> str:
    """One spelling per address, so one worker cannot be registered twice: IP literals in
    their compressed form, and (plain grpc and http only: TLS checks the name)
    ``localhost`` as ``127.0.0.1``."""
    host = host.lower().rstrip(".")
    try:
        return ipaddress.ip_address(host).compressed
    except ValueError:
        pass
    if host == "localhost" and scheme in ("grpc", "http"):
        return "127.0.0.1"
    return host
