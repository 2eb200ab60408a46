"""`smg launch` command lines start token-gateway: SMG's flags and policy names as aliases.

Each SMG flag is one of:

- an **alias**: same meaning, written onto our setting (with unit conversion where
  SMG counts differently, e.g. ``--retry-max-retries 3`` is ``--max-attempts 4``);
- **ignored** with a start-up warning that names what token-gateway does instead
  (tuning knobs of SMG's own algorithms that have no counterpart here and whose
  absence cannot make a request fail);
- **refused** with an error naming our equivalent, where going on would silently
  change behaviour an operator relies on (authentication, HA mesh, logging to files).

The aliases are hidden from ``--help`` (it shows our own names); docs/operations.md has
the full map. Aliases whose target setting is not in this build (another engineer's
option not merged yet) are refused, naming the flag.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.settings import explicit_flags, mark_explicit

log = logging.getLogger("gateway")

IGNORED = "_smg_ignored"  # namespace attribute: [(flag, note)] to warn about at start-up


@dataclass(frozen=True)
class Alias:
    flag: str
    kind: str  # "alias" | "switch" | "check" (validate, then nothing to set) | "ignored" | "refused"
    dests: tuple[str, ...] = ()  # candidate targets; the first one the parser has wins
    convert: Callable[[Any], Any] | None = None
    const: Any = None  # value a switch sets
    nargs: Any = None  # argparse nargs of the SMG flag
    note: str = ""
    weak: bool = False  # a switch that only fills in a default: an explicit target value wins


def _ms(value: str) -> float:
    return float(value) / 1000.0


def _plus_one(value: str) -> int:
    return int(value) + 1


def _one_ca(values: list[str]) -> str:
    if len(values) != 1:
        raise argparse.ArgumentTypeError("--ca-cert-paths: give one CA bundle (concatenate the PEM files)")
    return values[0]


def _selector(values: list[str]) -> list[str]:
    return list(values)


_WHY_NO_THRESHOLDS = (
    "token-gateway's cache_aware scores each worker by its cached prefix against its load "
    "(tune with --prefill-weight, --decode-weight, --request-weight); it has no threshold switch"
)

ALIASES: tuple[Alias, ...] = (
    # routing
    Alias("--cache-threshold", "ignored", nargs=1, note=_WHY_NO_THRESHOLDS),
    Alias("--balance-abs-threshold", "ignored", nargs=1, note=_WHY_NO_THRESHOLDS),
    Alias("--balance-rel-threshold", "ignored", nargs=1, note=_WHY_NO_THRESHOLDS),
    Alias("--eviction-interval", "alias", ("eviction_interval_s",), float, note="seconds between tree eviction passes"),
    Alias("--eviction-interval-secs", "alias", ("eviction_interval_s",), float),
    Alias("--max-tree-size", "alias", ("tree_max_tokens",), int, note="cap on tokens held by one radix tree"),
    Alias("--block-size", "ignored", nargs=1, note="KV block size is learned from the workers (GetServerInfo/KV events)"),
    Alias("--prefix-token-count", "alias", ("hash_depth_tokens",), int),
    Alias("--prefix-hash-load-factor", "alias", ("load_factor",), float),
    Alias("--max-idle-secs", "ignored", nargs=1, note="manual maps to consistent_hash, whose key ring needs no idle eviction"),
    Alias("--assignment-mode", "ignored", nargs=1, note="manual maps to consistent_hash: new keys go to their ring owner"),
    Alias("--dp-aware", "ignored", nargs=0, note="always on: a worker that reports dp_size > 1 is routed to rank by rank (host:port@rank); --worker-dp-size overrides the reported size"),
    Alias("--dp-minimum-tokens-scheduler", "ignored", nargs=0, note="see --dp-aware"),
    Alias("--enable-igw", "ignored", nargs=0, note="several models behind one gateway always work"),
    Alias("--load-monitor-interval", "alias", ("load_poll_interval_s",), float),
    Alias("--pd-disaggregation", "ignored", nargs=0, note="PD mode follows from --prefill/--decode"),
    Alias("--worker-startup-timeout-secs", "alias", ("worker_startup_timeout_s",), float),
    Alias("--worker-startup-check-interval", "ignored", nargs=1,
          note="listed workers not up at start are retried with a growing pause (0.5 s to 10 s)"),
    # requests, admission, retries, breaker, health
    Alias("--request-timeout-secs", "alias", ("request_timeout_s",), float),
    Alias("--shutdown-grace-period-secs", "alias", ("shutdown_grace_s",), float),
    Alias("--max-payload-size", "alias", ("max_body_bytes",), int),
    Alias("--queue-size", "alias", ("max_queued_requests",), int),
    Alias("--queue-timeout-secs", "alias", ("queue_timeout_s",), float),
    Alias("--rate-limit-tokens-per-second", "alias", ("rate_limit_per_s",), float,
          note="token-gateway keeps one bucket per API key (one shared bucket without --api-keys)"),
    Alias("--retry-max-retries", "alias", ("max_attempts",), _plus_one, note="retries + 1 attempts"),
    Alias("--retry-initial-backoff-ms", "alias", ("backoff_base_s",), _ms),
    Alias("--retry-max-backoff-ms", "alias", ("backoff_max_s",), _ms),
    Alias("--retry-backoff-multiplier", "ignored", nargs=1, note="back-off doubles per attempt, with full jitter"),
    Alias("--retry-jitter-factor", "ignored", nargs=1, note="back-off uses full jitter"),
    Alias("--disable-retries", "switch", ("max_attempts",), const=1),
    Alias("--cb-failure-threshold", "alias", ("breaker_failure_threshold",), int),
    Alias("--cb-timeout-duration-secs", "alias", ("breaker_cooldown_s",), float),
    Alias("--cb-success-threshold", "alias", ("breaker_half_open_probes",), int),
    Alias("--cb-window-duration-secs", "alias", ("breaker_window_s",), float),
    Alias("--disable-circuit-breaker", "switch", ("breaker_disabled",), const=True,
          note="the breaker stays on; --breaker-failure-threshold sets how many failures open it"),
    Alias("--health-check-interval-secs", "alias", ("health_check_interval_s",), float),
    Alias("--health-check-timeout-secs", "alias", ("health_check_timeout_s",), float),
    Alias("--health-check-endpoint", "ignored", nargs=1, note="workers are probed with the gRPC HealthCheck RPC"),
    Alias("--disable-health-check", "switch", ("health_check_interval_s",), const=0.0),
    Alias("--remove-unhealthy-workers", "ignored", nargs=0,
          note="unhealthy workers leave rotation and come back when probes pass; remove with DELETE /workers"),
    # metrics, tracing, logging
    Alias("--prometheus-duration-buckets", "ignored", nargs="+", note="histogram buckets are fixed (docs/operations.md)"),
    Alias("--enable-trace", "switch", ("otlp_traces_endpoint",), const="localhost:4317", weak=True,
          note="tracing is on when --otlp-traces-endpoint is set"),
    Alias("--log-dir", "refused", nargs=1, note="token-gateway logs to stderr; let the container runtime or systemd keep the files"),
    # TLS, auth
    Alias("--tls-cert-path", "alias", ("tls_cert_file",), str),
    Alias("--tls-key-path", "alias", ("tls_key_file",), str),
    Alias("--client-cert-path", "alias", ("worker_tls_cert_file",), str),
    Alias("--client-key-path", "alias", ("worker_tls_key_file",), str),
    Alias("--ca-cert-paths", "alias", ("worker_tls_ca_file",), _one_ca, nargs="+"),
    Alias("--api-key", "alias", ("worker_api_key",), str, note="SMG's --api-key is the key sent to workers"),
    Alias("--control-plane-api-keys", "refused", nargs="+",
          note="use --admin-api-key (or --admin-api-key-file) for admin endpoints and --api-keys for inference"),
    Alias("--jwt-issuer", "refused", nargs=1, note="token-gateway checks bearer keys (--api-keys); put OIDC in the ingress"),
    Alias("--jwt-audience", "refused", nargs=1, note="see --jwt-issuer"),
    Alias("--jwt-jwks-uri", "refused", nargs=1, note="see --jwt-issuer"),
    Alias("--cors-allowed-origins", "ignored", nargs="+", note="no CORS headers are sent; add them in the ingress if browsers call the gateway"),
    Alias("--request-id-headers", "ignored", nargs="+", note="X-Request-Id is honoured and echoed"),
    # tokenizer and parsers
    Alias("--model-path", "alias", ("tokenizer_path",), os.path.expanduser,
          note="a local folder is the tokenizer; a hub id is ignored (the tokenizer comes from the workers or the hub by the model they report)"),
    Alias("--disable-tokenizer-autoload", "ignored", nargs=0, note="tokenizers load when a worker of the model registers"),
    Alias("--tokenizer-cache-enable-l0", "ignored", nargs=0, note="the prompt token cache is always on"),
    Alias("--tokenizer-cache-l0-max-entries", "ignored", nargs=1, note="the prompt token cache is always on"),
    Alias("--tokenizer-cache-enable-l1", "ignored", nargs=0, note="the prompt token cache is always on"),
    Alias("--tokenizer-cache-l1-max-memory", "ignored", nargs=1, note="the prompt token cache is always on"),
    Alias("--chat-template", "alias", ("chat_template",), str),
    Alias("--reasoning-parser", "alias", ("reasoning_parser",), str),
    Alias("--tool-call-parser", "alias", ("tool_call_parser",), str),
    # discovery and HA
    Alias("--service-discovery", "switch", ("k8s_discovery",), const=True),
    Alias("--selector", "alias", ("k8s_selector",), _selector, nargs="+"),
    Alias("--prefill-selector", "alias", ("k8s_prefill_selector",), _selector, nargs="+"),
    Alias("--decode-selector", "alias", ("k8s_decode_selector",), _selector, nargs="+"),
    Alias("--service-discovery-namespace", "alias", ("k8s_namespace",), str),
    Alias("--service-discovery-port", "alias", ("k8s_port",), int),
    Alias("--enable-mesh", "refused", nargs=0, note="replicas share routing state with --sync-url (NATS)"),
    Alias("--mesh-server-name", "refused", nargs=1, note="replicas share routing state with --sync-url (NATS)"),
    Alias("--mesh-host", "refused", nargs=1, note="replicas share routing state with --sync-url (NATS)"),
    Alias("--mesh-port", "refused", nargs=1, note="replicas share routing state with --sync-url (NATS)"),
    Alias("--mesh-peer-urls", "refused", nargs="+", note="replicas share routing state with --sync-url (NATS)"),
    Alias("--router-selector", "refused", nargs="+", note="replicas share routing state with --sync-url (NATS)"),
)

# SMG value spellings of our choices.
POLICY_VALUES = {
    "consistent_hashing": "consistent_hash",
    "manual": "consistent_hash",  # sticky by X-SMG-Routing-Key, like SMG's manual
}
REFUSED_POLICIES = {
    "bucket": "token-gateway has no bucket policy: use cache_aware (load-aware) or least_load",
}
LOG_LEVELS = {"warn": "warning", "trace": "debug"}
POLICY_DESTS = ("policy", "prefill_policy", "decode_policy")


def map_value(dest: str, value: Any) -> Any:
    """SMG's spelling of a value -> ours (also applied to environment and file values)."""
    if not isinstance(value, str):
        if dest == "max_concurrent_requests" and isinstance(value, int) and value == -1:
            return 0  # SMG: -1 = unlimited; ours: 0 (other negatives are refused as typos)
        return value
    if dest in POLICY_DESTS:
        if value in REFUSED_POLICIES:
            raise ValueError(f"policy {value!r}: {REFUSED_POLICIES[value]}")
        return POLICY_VALUES.get(value, value)
    if dest == "log_level":
        return LOG_LEVELS.get(value.lower(), value.lower())
    if dest == "max_concurrent_requests" and value.strip() == "-1":
        return "0"
    return value


def _dests(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.dest: a for a in parser._actions}


class _AliasAction(argparse.Action):
    def __init__(self, *args: Any, alias: Alias, target: str | None, **kwargs: Any) -> None:
        self.alias = alias
        self.target = target
        super().__init__(*args, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        a = self.alias
        if a.kind == "refused":
            parser.error(f"{a.flag} is not supported: {a.note}")
        if a.kind == "check":
            try:
                a.convert(values[0] if isinstance(values, list) else values)  # type: ignore[misc]
            except ValueError as exc:
                parser.error(f"{a.flag}: {exc}")
            return
        if a.kind == "ignored" or self.target is None:
            ignored = getattr(namespace, IGNORED, None) or []
            ignored.append((a.flag, a.note or "no equivalent in token-gateway"))
            setattr(namespace, IGNORED, ignored)
            return
        if a.kind == "switch":
            if a.weak and self.target in explicit_flags(namespace):
                return  # an explicit value of the target beats the switch's default
            value = a.const
        else:
            raw = values[0] if isinstance(values, list) and a.nargs is None else values
            try:
                value = a.convert(raw) if a.convert else raw
            except (ValueError, argparse.ArgumentTypeError) as exc:
                parser.error(f"{a.flag}: {exc}")
        setattr(namespace, self.target, value)
        mark_explicit(namespace, self.target)


def _wrap_type(action: argparse.Action) -> None:
    inner = action.type
    dest = action.dest

    def convert(text: str) -> Any:
        try:
            mapped = map_value(dest, text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return inner(mapped) if callable(inner) else mapped

    convert.__name__ = getattr(inner, "__name__", "value")
    action.type = convert


def install(parser: argparse.ArgumentParser) -> None:
    """Add SMG's flags (hidden) to ``serve``'s parser and accept SMG's value spellings."""
    dests = _dests(parser)
    for dest in (*POLICY_DESTS, "log_level", "max_concurrent_requests"):
        if dest in dests:
            _wrap_type(dests[dest])
    taken = {s for a in parser._actions for s in a.option_strings}
    for alias in ALIASES:
        if alias.flag in taken:
            continue  # we have the flag ourselves (same name, same meaning)
        target = next((d for d in alias.dests if d in dests), None)
        kind = alias.kind
        if kind in ("alias", "switch") and target is None:
            # the setting it maps onto is not in this build: say so, or warn if harmless
            kind = "ignored" if alias.note else "refused"
            nargs = 0 if alias.kind == "switch" else (alias.nargs if alias.nargs is not None else 1)
            alias = Alias(alias.flag, kind, nargs=nargs,
                          note=alias.note or f"this build has no --{alias.dests[0].replace('_', '-')}")
        nargs = 0 if alias.kind == "switch" else alias.nargs
        kwargs: dict[str, Any] = {"nargs": nargs} if nargs is not None else {}
        parser.add_argument(alias.flag, action=_AliasAction, alias=alias, target=target,
                            dest=f"_smg_{alias.flag[2:].replace('-', '_')}", default=argparse.SUPPRESS,
                            help=argparse.SUPPRESS, **kwargs)


def warn_ignored(args: argparse.Namespace) -> list[str]:
    """Log (and return) one warning per SMG flag that was accepted but has no effect."""
    lines = [f"{flag} has no effect in token-gateway: {note}" for flag, note in getattr(args, IGNORED, None) or []]
    for line in lines:
        log.warning("%s", line)
    return lines


def documented() -> Sequence[Alias]:
    return ALIASES
