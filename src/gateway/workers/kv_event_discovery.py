"""A worker's own KV-event publisher, read from what it reports of its configuration
(``serve --kv-events --kv-events-zmq auto``), so the operator need not write an entry per worker.

Where each engine reports it:

* SGLang, both transports: its server arguments (HTTP ``/get_server_info``, gRPC
  GetServerInfo's ``server_args``) carry ``kv_events_config``, the JSON text its
  ``--kv-events-config`` took;
* vLLM's OpenAI server: ``/server_info?config_format=json`` (served only when vLLM runs with
  ``VLLM_SERVER_DEV_MODE=1``) gives its whole configuration, ``kv_events_config`` an object
  in it; the client copies that object into the server arguments (``workers.vllm_http``);
* vLLM's gRPC GetServerInfo carries no KV-event configuration: such a worker needs an
  explicit ``--kv-events-zmq`` entry.

The config is read as the engine reads it: no publisher (``publisher`` null, or vLLM's
``enable_kv_cache_events`` false) means no feed; ``zmq`` gives the endpoint and the replay
endpoint, read by the rule of an explicit entry (``workers.zmq_kv_events``), with the
difference that a wildcard host the worker reports (``*``, ``0.0.0.0``, ``::``) means the
worker binds every interface, so the gateway connects to the worker's own host (its URL's);
the gateway never binds a wildcard. SGLang binds ``0.0.0.0``; vLLM connects to it, which
the gateway cannot serve, so that is refused with the reason. SGLang's ``bind`` key, when
set, says which end binds. Any endpoint the gateway cannot use raises ``BadZmqSource`` with
the reason, which the feeder shows in ``GET /workers`` and logs; the worker still joins.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.workers.zmq_kv_events import BadZmqSource, ZmqEndpoint, parse_endpoint, parse_replay

ENGINES_DEFAULT_ENDPOINT = "tcp://*:5557"
"""What both engines publish on when their config names a ZMQ publisher and no endpoint."""

_WILDCARDS = ("*", "0.0.0.0", "::")


def read_config(reported: str) -> dict[str, Any] | None:
    """The worker's ``kv_events_config`` as reported (JSON text; "" when it reports none)."""
    if not reported:
        return None
    try:
        config = json.loads(reported)
    except ValueError:
        raise BadZmqSource(f"the worker's kv_events_config is not JSON: {reported[:200]!r}") from None
    if config is None:
        return None
    if not isinstance(config, dict):
        raise BadZmqSource(f"the worker's kv_events_config is not an object: {reported[:200]!r}")
    return config


def discover(reported: str, *, binds_unspecified: bool) -> ZmqEndpoint | None:
    """The publisher a worker reports (None: it publishes none). ``binds_unspecified``: the
    engine binds a ``0.0.0.0`` endpoint (SGLang) rather than connecting to it (vLLM)."""
    config = read_config(reported)
    if config is None or config.get("enable_kv_cache_events") is False:
        return None
    publisher = config.get("publisher")
    if publisher in (None, "", "null"):
        return None
    if publisher != "zmq":
        raise BadZmqSource(f"the worker publishes KV events with {publisher!r}; the gateway reads ZMQ publishers only")
    endpoint = _endpoint(str(config.get("endpoint") or ENGINES_DEFAULT_ENDPOINT), config.get("bind"), binds_unspecified)
    replay = config.get("replay_endpoint")
    if replay:
        rep = parse_replay(str(replay))
        return ZmqEndpoint(endpoint.scheme, endpoint.host, endpoint.port, endpoint.path, endpoint.vllm_binds, rep)
    return endpoint


def _endpoint(text: str, bind: object, binds_unspecified: bool) -> ZmqEndpoint:
    """The reported endpoint by the engine's rule; ``bind`` (SGLang's override) when a bool."""
    scheme, sep, rest = text.strip().partition("://")
    if scheme != "tcp" or not sep:
        return parse_endpoint(text)  # ipc (the engine binds, the gateway connects) or a refusal
    host, _, port = rest.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    wildcard = host in _WILDCARDS
    engine_binds = bind if isinstance(bind, bool) else ("*" in host or "::" in host or (host == "0.0.0.0" and binds_unspecified))
    if wildcard:
        if not engine_binds:
            raise BadZmqSource(
                f"the worker reports {text!r} and connects to it: the gateway would have to bind every interface,"
                " which it never does (have the worker bind, tcp://*:PORT, or connect to one address of the gateway)"
            )
        return parse_endpoint(f"tcp://*:{port}")
    if engine_binds:  # the engine binds this one address: the gateway connects to it, a name or an address
        if not port.isdigit() or not 0 < int(port) < 65536 or not host:
            raise BadZmqSource(f"the worker reports {text!r}: a KV-event endpoint needs a host and a port in 1-65535")
        return ZmqEndpoint("tcp", host, int(port), vllm_binds=True)
    return parse_endpoint(text)  # the engine connects out: the gateway binds that address of its own host


__all__ = ["ENGINES_DEFAULT_ENDPOINT", "discover", "read_config"]
