"""Discovery settings (DNS and Kubernetes); both off by default."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.settings import option


@dataclass
class DiscoveryConfig:
    dns_workers: list[str] = option(
        [], "workers from DNS, re-resolved: [ROLE=]NAME:PORT (A/AAAA records, e.g. a headless Service) "
        "or [ROLE=]_SERVICE._PROTO.NAME (SRV records give host and port); ROLE: regular, prefill or decode"
    )
    dns_interval_s: float = option(10.0, "seconds between DNS re-resolutions")
    dns_nameservers: list[str] = option([], "DNS servers to ask, IP or IP:PORT (unset: the system's resolv.conf)")
    dns_timeout_s: float = option(2.0, "time one DNS query may take, seconds (a timeout keeps the last answer)")
    discovery_scheme: str = option("grpc", "scheme of discovered worker URLs", choices=["grpc", "grpcs"])
    k8s_discovery: bool = option(False, "discover workers from Kubernetes pods (needs kubernetes-asyncio, in-cluster or kubeconfig)")
    k8s_selector: list[str] = option([], "label selector of regular worker pods, KEY=VALUE ...")
    k8s_prefill_selector: list[str] = option([], "label selector of prefill worker pods, KEY=VALUE ...")
    k8s_decode_selector: list[str] = option([], "label selector of decode worker pods, KEY=VALUE ...")
    k8s_role_label: str = option("token-gateway.io/role", "pod label whose value (regular, prefill, decode) sets a pod's role when --k8s-selector matches it")
    k8s_namespace: str | None = option(None, "namespace to watch (unset: all namespaces)")
    k8s_port: int = option(30000, "worker gRPC port on each pod (a container port named 'grpc' wins)")
    k8s_bootstrap_port_annotation: str = option("sglang.ai/bootstrap-port", "pod annotation giving a prefill pod's bootstrap port")

    @property
    def dns_enabled(self) -> bool:
        return bool(self.dns_workers)
