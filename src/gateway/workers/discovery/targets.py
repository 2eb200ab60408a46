"""What discovery flags name, parsed and checked before anything starts (pure functions)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

ROLES = ("regular", "prefill", "decode")


@dataclass(frozen=True)
class DnsName:
    name: str
    port: int | None  # None: SRV records carry the port
    role: str | None = None

    @property
    def srv(self) -> bool:
        return self.port is None


def parse_dns_target(text: str) -> DnsName:
    """``[ROLE=]NAME:PORT`` or ``[ROLE=]_SERVICE._PROTO.NAME``."""
    role = None
    if "=" in text:
        role, _, text = text.partition("=")
        if role not in ROLES:
            raise ValueError(f"--dns-workers {role}=...: role must be one of {', '.join(ROLES)}")
    if text.startswith("_"):
        return DnsName(text.rstrip("."), None, role)
    name, sep, port = text.rpartition(":")
    if not sep or not name or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--dns-workers {text!r}: give NAME:PORT (A/AAAA) or _SERVICE._PROTO.NAME (SRV)")
    return DnsName(name.rstrip("."), int(port), role)


def selector_string(pairs: list[str]) -> str:
    """``["app=sglang", "tier=gpu"]`` -> ``"app=sglang,tier=gpu"`` (the API's labelSelector)."""
    for pair in pairs:
        if "=" not in pair:
            raise ValueError(f"label selector {pair!r}: use KEY=VALUE")
    return ",".join(pairs)


def worker_url(scheme: str, host: str, port: int) -> str:
    host = host.rstrip(".")
    try:
        if ipaddress.ip_address(host).version == 6:
            host = f"[{host}]"
    except ValueError:
        pass
    return f"{scheme}://{host}:{port}"
