"""Workers from DNS: A/AAAA records of a name (a headless Service) or its SRV records.

Re-resolved every ``--dns-interval-s``. An authoritative "no such name / no records"
answer means the set is empty (the pods are gone); a timeout or server failure keeps
the last answer, so a DNS hiccup never drains the fleet. Uses dnspython's asyncio
resolver.
"""

from __future__ import annotations

import asyncio
import logging

from gateway.workers.discovery.config import DiscoveryConfig
from gateway.workers.discovery.reconcile import Reconciler, Target
from gateway.workers.discovery.targets import DnsName, parse_dns_target, worker_url
from gateway.workers.periodic import Periodic

log = logging.getLogger(__name__)

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
