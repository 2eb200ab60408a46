"""Who may call what: inference keys, the separate admin key, and the start-up guard.

Inference endpoints take any configured inference key (or the admin key); admin
endpoints (worker registration and removal, cache flush) take only the admin key.
Without an admin key the admin endpoints are open, which the gateway allows only
on a loopback address unless the operator says ``--allow-unauthenticated-admin``.
Keys are compared in constant time and never logged.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass

from gateway.protocol.errors import AuthenticationError, PermissionDeniedError
from gateway.protocol.headers import AUTHORIZATION
from gateway.settings import option
from gateway.workers.client import TlsOptions


@dataclass
class SecurityConfig:
    admin_api_key: str | None = option(None, "key for admin endpoints (POST/DELETE /workers, /flush_cache), sent as 'Authorization: Bearer KEY'")
    allow_unauthenticated_admin: bool = option(False, "serve admin endpoints without a key on a non-loopback address")
    inspect_access: str = option("admin", "who may inspect the live routing tree (/admin/inspect, InspectPrefix): 'admin' (its answers reveal other tenants' cached prefixes) or 'any' inference key (single-tenant deployments)", choices=["admin", "any"])
    cache_salt_per_key: bool = option(False, "give every API key its own cache salt: tenants never share prefix cache (costs 4 prompt tokens per request; see docs/security.md)")
    metrics_access: str = option("auto", "who may read /metrics: 'open', 'key' (any API key), or 'auto' (open on a loopback address, else needs a key)", choices=["auto", "open", "key"])
    worker_tls_ca_file: str | None = option(None, "CA bundle that signs grpcs:// and https:// workers' certificates (unset: system roots)")
    worker_tls_cert_file: str | None = option(None, "client certificate for mutual TLS to grpcs:// and https:// workers")
    worker_tls_key_file: str | None = option(None, "private key of --worker-tls-cert-file")

    def tls(self) -> TlsOptions | None:
        if not (self.worker_tls_ca_file or self.worker_tls_cert_file or self.worker_tls_key_file):
            return None
        if bool(self.worker_tls_cert_file) != bool(self.worker_tls_key_file):
            raise ValueError("--worker-tls-cert-file and --worker-tls-key-file go together")
        return TlsOptions(self.worker_tls_ca_file, self.worker_tls_cert_file, self.worker_tls_key_file)


class InsecureAdminError(ValueError):
    """Admin endpoints would be open to the network."""


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_startup(host: str, config: SecurityConfig) -> None:
    """Refuse to serve unauthenticated admin endpoints beyond loopback unless allowed."""
    if config.admin_api_key or config.allow_unauthenticated_admin or is_loopback(host):
        return
    raise InsecureAdminError(
        f"refusing to serve admin endpoints without a key on {host!r}: "
        "set --admin-api-key, bind a loopback address, or pass --allow-unauthenticated-admin"
    )


def bearer_token(headers: Mapping[str, str]) -> str | None:
    auth = headers.get(AUTHORIZATION, "")
    scheme, _, token = auth.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def key_id(token: str | None) -> str | None:
    """A short non-reversible id for a key (for rate-limit buckets and logs)."""
    if token is None:
        return None
    return hashlib.sha256(token.encode()).hexdigest()[:12]


def _matches(token: str, key: str) -> bool:
    return hmac.compare_digest(token.encode(), key.encode())


class Authenticator:
    """Checks the bearer key of every call, HTTP or gRPC (the gRPC doors reach it
    through ``server.grpc.util.CallContextReader``)."""

    def __init__(self, inference_keys: list[str], config: SecurityConfig) -> None:
        self._keys = [k for k in inference_keys if k]
        self._admin = config.admin_api_key or None
        self._inspect_any = config.inspect_access == "any"
        self._salt_per_key = config.cache_salt_per_key

    @property
    def admin_open(self) -> bool:
        return self._admin is None

    def inference(self, headers: Mapping[str, str]) -> str | None:
        """Check an inference call; returns the caller's key id. Without configured keys
        callers are anonymous (None): an unchecked token must not buy a fresh rate bucket."""
        if not self._keys:
            return None
        token = bearer_token(headers)
        if token is not None and (
            any(_matches(token, k) for k in self._keys) or (self._admin and _matches(token, self._admin))
        ):
            return key_id(token)
        raise AuthenticationError("missing or invalid API key (send 'Authorization: Bearer KEY')")

    def admin(self, headers: Mapping[str, str]) -> None:
        """Check an admin call: only the admin key passes (when one is configured)."""
        if self._admin is None:
            return
        token = bearer_token(headers)
        if token is not None and _matches(token, self._admin):
            return
        if token is not None and any(_matches(token, k) for k in self._keys):
            raise PermissionDeniedError("this endpoint needs the admin API key")
        raise AuthenticationError("missing or invalid admin API key (send 'Authorization: Bearer ADMIN_KEY')")

    def reader(self, headers: Mapping[str, str]) -> None:
        """Read-only admin views (worker lists, loads): they name the fleet's hosts and
        ports, so the admin key's rule, as on the gRPC door (an inference key gets 403)."""
        self.admin(headers)

    def admin_call(self, headers: Mapping[str, str]) -> str | None:
        """``admin`` for a call that also runs through the request pipeline: returns the
        caller's key id (None when admin endpoints are open)."""
        self.admin(headers)
        return key_id(bearer_token(headers)) if self._admin is not None else None

    def inspector(self, headers: Mapping[str, str]) -> str | None:
        """Inspection of the live routing tree tells which prefixes are cached, i.e. what
        other tenants sent: admin-only unless ``--inspect-access any``."""
        if self._inspect_any or self._admin is None:  # no admin key: as strict as inference
            return self.inference(headers)
        return self.admin_call(headers)

    def metrics(self, headers: Mapping[str, str]) -> None:
        """A /metrics scrape with a key: any inference key or the admin key."""
        if not self._keys and self._admin is None:
            raise AuthenticationError("/metrics needs a key, and this gateway has none configured; set --api-keys or --admin-api-key, or --metrics-access open")
        token = bearer_token(headers)
        if token is not None and (
            any(_matches(token, k) for k in self._keys) or (self._admin and _matches(token, self._admin))
        ):
            return
        raise AuthenticationError("missing or invalid API key (send 'Authorization: Bearer KEY')")

    def key_salt(self, key: str | None) -> str | None:
        """The cache salt of a caller's key id, when ``--cache-salt-per-key`` is on."""
        return f"key:{key}" if self._salt_per_key and key else None
