"""Where a worker is: its URL checked and spelled one way (``grpc://host:port``).

Apart from the client so the transport interface (``workers/transport.py``) and
every implementation can name an address without importing the gRPC client.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlparse


class BadWorkerUrl(ValueError):
    """A worker URL that is not grpc://host:port or grpcs://host:port."""


@dataclass(frozen=True, slots=True)
class WorkerAddress:
    scheme: str  # "grpc" or "grpcs"
    host: str
    port: int

    @property
    def target(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.target}"


def parse_worker_url(url: str) -> WorkerAddress:
    """Accept only grpc:// and grpcs:// URLs with an explicit host and port."""
    parsed = urlparse(url.strip())
    if parsed.scheme not in ("grpc", "grpcs"):
        raise BadWorkerUrl(f"worker URL must start with grpc:// or grpcs://, got {url!r}")
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
    their compressed form, and (plain grpc only: TLS checks the name) ``localhost`` as
    ``127.0.0.1``."""
    host = host.lower().rstrip(".")
    try:
        return ipaddress.ip_address(host).compressed
    except ValueError:
        pass
    if host == "localhost" and scheme == "grpc":
        return "127.0.0.1"
    return host
