"""DNS discovery against a real DNS server: dnsmasq on 127.0.0.1, records from files written here.

dnsmasq comes from Debian's package; the fixture installs it with apt-get when it is
missing and the test runs as root (CI), and fails with the reason otherwise.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.server.config import GatewayConfig, ServerConfig
from gateway.server.state import GatewayState
from gateway.workers.discovery.config import DiscoveryConfig
from gateway.workers.discovery.dns import DnsDiscovery
from gateway.workers.discovery.reconcile import Reconciler, Target
from gateway.workers.discovery.targets import parse_dns_target, worker_url
from gateway_lab.sim.config import SimConfig
from gateway_lab.sim.worker import SimWorker

ZERO_COST = dict(step_base_s=0.0, prefill_token_s=0.0, decode_seq_s=0.0, time_scale=0.0)


def _dnsmasq() -> str:
    found = shutil.which("dnsmasq") or next((p for p in ("/usr/sbin/dnsmasq",) if os.path.exists(p)), None)
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.fail("dnsmasq is not installed and cannot be installed here (needs root and apt-get): apt-get install dnsmasq")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, timeout=600)
    subprocess.run(["apt-get", "install", "-y", "-qq", "dnsmasq-base"], check=True, env=env, timeout=600)
    found = shutil.which("dnsmasq") or "/usr/sbin/dnsmasq"
    if not os.path.exists(found):
        pytest.fail("apt-get install dnsmasq-base did not provide dnsmasq")
    return found


def _free_udp_port() -> int:
    """A port free for both UDP and TCP on 127.0.0.1 (dnsmasq listens on both)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        try:
            with socket.socket() as t:
                t.bind(("127.0.0.1", port))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port for dnsmasq")


@dataclass
class Dns:
    port: int
    hosts: Path
    proc: subprocess.Popen[bytes]

    def set_hosts(self, lines: list[str]) -> None:
        self.hosts.write_text("".join(f"{line}\n" for line in lines))
        self.proc.send_signal(signal.SIGHUP)  # dnsmasq re-reads its hosts files
        time.sleep(0.2)

    @property
    def nameserver(self) -> str:
        return f"127.0.0.1:{self.port}"


@pytest.fixture
def dns_server(tmp_path: Path) -> Iterator[Dns]:
    binary = _dnsmasq()
    hosts = tmp_path / "hosts"
    hosts.write_text("")
    port = _free_udp_port()
    argv = [binary, "--no-daemon", "--keep-in-foreground", f"--port={port}", "--listen-address=127.0.0.1",
            "--bind-interfaces", "--no-resolv", "--no-hosts", f"--addn-hosts={hosts}", "--conf-file=/dev/null",
            "--local=/test/", "--pid-file=", "--log-facility=-",
            "--srv-host=_grpc._tcp.srv.test,w1.test,{p1}", "--srv-host=_grpc._tcp.srv.test,w2.test,{p2}"]
    if os.geteuid() == 0:
        argv.append("--user=root")
    proc: subprocess.Popen[bytes] | None = None

    def start(p1: int, p2: int) -> Dns:
        nonlocal proc
        real = [a.format(p1=p1, p2=p2) for a in argv]
        proc = subprocess.Popen(real, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(0.3)
        if proc.poll() is not None:
            pytest.fail(f"dnsmasq did not start: {proc.stderr.read().decode() if proc.stderr else ''}")
        return Dns(port, hosts, proc)

    yield start  # type: ignore[misc]
    if proc is not None:
        proc.terminate()
        proc.wait(timeout=10)


async def _workers(hosts: list[str], port: int) -> list[SimWorker]:
    out = []
    for host in hosts:
        w = SimWorker(SimConfig(**ZERO_COST))
        await w.start(host, port)
        out.append(w)
    return out


def _shared_port(hosts: list[str]) -> int:
    for _ in range(20):
        with socket.socket() as s:
            s.bind((hosts[0], 0))
            port = int(s.getsockname()[1])
        try:
            for h in hosts[1:]:
                with socket.socket() as s:
                    s.bind((h, port))
            return port
        except OSError:
            continue
    raise RuntimeError("no port free on every loopback address")


def test_parse_targets() -> None:
    assert parse_dns_target("workers.ns.svc:30001") == parse_dns_target("workers.ns.svc.:30001")
    t = parse_dns_target("prefill=_grpc._tcp.p.ns.svc")
    assert (t.srv, t.role, t.name) == (True, "prefill", "_grpc._tcp.p.ns.svc")
    for bad in ("workers", "workers:0", "boss=w:1", "w:http"):
        with pytest.raises(ValueError):
            parse_dns_target(bad)
    assert worker_url("grpc", "::1", 5) == "grpc://[::1]:5"
    assert worker_url("grpcs", "w1.test.", 5) == "grpcs://w1.test:5"


async def test_a_records_feed_the_registry(dns_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    addresses = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    port = _shared_port(addresses)
    dns: Dns = dns_server(1, 2)
    dns.set_hosts([f"{addresses[0]} workers.test", f"{addresses[1]} workers.test"])
    workers = await _workers(addresses, port)
    config = GatewayConfig(
        server=ServerConfig(tokenizer_cache_dir=str(tmp_path / "tok")),
        discovery=DiscoveryConfig(dns_workers=[f"workers.test:{port}"], dns_interval_s=0.2, dns_timeout_s=0.3,
                                  dns_nameservers=[dns.nameserver]),
    )
    config.server.worker_drain_timeout_s = 1.0
    state = GatewayState(config)
    try:
        await state.start()
        assert state.ready
        assert {w.id for w in state.registry.all()} == {f"{a}:{port}" for a in addresses[:2]}
        dns.set_hosts([f"{addresses[1]} workers.test", f"{addresses[2]} workers.test"])
        want = {f"{a}:{port}" for a in addresses[1:]}
        deadline = time.monotonic() + 15
        while {w.id for w in state.registry.all()} != want and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.1)
        assert {w.id for w in state.registry.all()} == want
        dns.proc.send_signal(signal.SIGSTOP)  # the DNS server hangs: the fleet stays as it was
        try:
            await asyncio.sleep(1.0)
            assert {w.id for w in state.registry.all()} == want
        finally:
            dns.proc.send_signal(signal.SIGCONT)
        dns.set_hosts([])  # the name is gone: every discovered worker leaves
        deadline = time.monotonic() + 15
        while state.registry.all() and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.1)
        assert state.registry.all() == []
    finally:
        await state.stop()
        for w in workers:
            await w.stop(0.1)


async def test_srv_records(dns_server) -> None:  # type: ignore[no-untyped-def]
    dns: Dns = dns_server(30001, 30002)
    dns.set_hosts(["127.0.0.5 w1.test", "127.0.0.6 w2.test", "fd00::7 v6.test", "127.0.0.7 v6.test"])
    seen: list[dict[str, Target]] = []

    async def add(t: Target) -> object:
        return t

    async def remove(url: str) -> object:
        return url

    source = DnsDiscovery(
        DiscoveryConfig(dns_workers=["decode=_grpc._tcp.srv.test"], dns_nameservers=[dns.nameserver]),
        Reconciler("dns", add, remove),
    )
    seen.append(await source.desired())
    assert set(seen[0]) == {"grpc://w1.test:30001", "grpc://w2.test:30002"}
    assert {t.role for t in seen[0].values()} == {"decode"}
    both = DnsDiscovery(DiscoveryConfig(dns_workers=["v6.test:5000"], dns_nameservers=[dns.nameserver]),
                        Reconciler("dns", add, remove))
    assert set(await both.desired()) == {"grpc://[fd00::7]:5000", "grpc://127.0.0.7:5000"}  # AAAA and A
