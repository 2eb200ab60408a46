"""Workers from DNS: A/AAAA records of a name (a headless Service) or its SRV records.

Re-resolved every ``--dns-interval-s``. An authoritative "no such name / no records"
answer means the set is empty (the pods are gone); a timeout or server failure keeps
the last answer, so a DNS hiccup never drains the fleet. Uses dnspython's asyncio
resolver.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from dataclasses import dataclass

from gateway.workers.discovery.config import DiscoveryConfig
from gateway.workers.discovery.reconcile import Reconciler, Target
from gateway.workers.periodic import Periodic

log = logging.getLogger(__name__)

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


def worker_url(scheme: str, host: str, port: int) -> str:
    host = host.rstrip(".")
    try:
        if ipaddress.ip_address(host).version == 6:
            host = f"[{host}]"
    except ValueError:
        pass
    return f"{scheme}://{host}:{port}"


def make_resolver(nameservers: list[str], timeout_s: float) -> object:
    import dns.asyncresolver
    import dns.nameserver

    resolver = dns.asyncresolver.Resolver(configure=not nameservers)
    if nameservers:
        servers = []
        for item in nameservers:
            host, sep, port = item.rpartition(":") if item.count(":") == 1 else (item, "", "")
            servers.append(dns.nameserver.Do53Nameserver(host.strip("[]") if sep else item.strip("[]"),
                                                         int(port) if sep else 53))
        resolver.nameservers = servers
    resolver.lifetime = timeout_s
    resolver.timeout = timeout_s
    return resolver


class DnsDiscovery(Periodic):
    name = "dns-discovery"

    def __init__(self, config: DiscoveryConfig, reconciler: Reconciler, resolver: object | None = None) -> None:
        super().__init__()
        self.config = config
        self.reconciler = reconciler
        self.names = [parse_dns_target(t) for t in config.dns_workers]
        self._resolver = resolver or make_resolver(config.dns_nameservers, config.dns_timeout_s)
        self._last: dict[DnsName, set[tuple[str, int]]] = {}

    def interval_s(self) -> float:
        return self.config.dns_interval_s

    async def _query(self, name: str, rdtype: str) -> list[object]:
        import dns.resolver

        try:
            answer = await self._resolver.resolve(name, rdtype)  # type: ignore[attr-defined]
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            return []
        return list(answer)

    async def lookup(self, target: DnsName) -> set[tuple[str, int]]:
        """(host, port) pairs for one name; raises on a transient failure."""
        if target.srv:
            return {(str(r.target), int(r.port)) for r in await self._query(target.name, "SRV")}  # type: ignore[attr-defined]
        v4, v6 = await asyncio.gather(self._query(target.name, "A"), self._query(target.name, "AAAA"))
        assert target.port is not None
        return {(r.address, target.port) for r in [*v4, *v6]}  # type: ignore[attr-defined]

    async def desired(self) -> dict[str, Target]:
        import dns.exception

        out: dict[str, Target] = {}
        for target in self.names:
            try:
                found = await self.lookup(target)
                self._last[target] = found
            except (dns.exception.DNSException, OSError) as exc:
                found = self._last.get(target, set())
                log.warning("dns-discovery: %s not resolved (%s); keeping %d known workers", target.name, exc, len(found))
            for host, port in found:
                url = worker_url(self.config.discovery_scheme, host, port)
                out[url] = Target(url, role=target.role)
        return out

    async def round(self) -> None:
        await self.reconciler.apply(await self.desired())

    async def first_round(self) -> None:
        try:
            await self.round()
        except Exception:
            log.exception("dns-discovery: first round failed")

    async def stop(self) -> None:
        await super().stop()
        await self.reconciler.close()
