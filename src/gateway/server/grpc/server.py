"""The gateway's gRPC port: its own API, the SGLang pass-through, health and reflection.

One ``grpc.aio`` server on the gateway's event loop, sharing the HTTP front
door's ``GatewayState`` (engine, router, registry, catalog): both doors run the
same pipeline over the same load counters and policies.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from gateway.proto import (
    gateway_pb2,
    gateway_pb2_grpc,
    sglang_scheduler_pb2,
    sglang_scheduler_pb2_grpc,
)
from gateway.server.grpc.front import TokenGatewayService
from gateway.server.grpc.passthrough import SchedulerPassthrough
from gateway.server.grpc.strict import register
from gateway.server.grpc.util import CallContextReader
from gateway.server.state import GatewayState

log = logging.getLogger(__name__)

GATEWAY_SERVICE = gateway_pb2.DESCRIPTOR.services_by_name["TokenGateway"].full_name
SCHEDULER_SERVICE = sglang_scheduler_pb2.DESCRIPTOR.services_by_name["SglangScheduler"].full_name


@dataclass
class GrpcServer:
    server: aio.Server
    host: str
    port: int
    health: health.aio.HealthServicer
    gateway: TokenGatewayService
    passthrough: SchedulerPassthrough

    @property
    def target(self) -> str:
        """``host:port`` for ``grpc.aio.insecure_channel``."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    async def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", GATEWAY_SERVICE, SCHEDULER_SERVICE):
            await self.health.set(name, status)

    async def stop(self, grace: float | None = 5.0) -> None:
        """Refuse new calls, give running ones ``grace`` seconds, then cancel them
        (cancelling aborts their worker requests)."""
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)


async def start_grpc_server(
    state: GatewayState, host: str = "127.0.0.1", port: int = 0, *, reuse_port: bool = False
) -> GrpcServer:
    """Bind ``host:port`` (0: a free port), register every service and start serving.
    ``reuse_port``: share the port with the other processes of ``serve --processes N``."""
    config = state.config.server
    # upb parses a request whole, holding the GIL, before any handler or bound runs: the
    # message's size is the one bound on that parse.
    max_bytes = min(config.max_body_bytes, config.grpc_max_message_bytes)
    server = aio.server(
        options=[
            ("grpc.max_receive_message_length", max_bytes),
            ("grpc.max_send_message_length", max(max_bytes, 64 * 1024 * 1024)),
            ("grpc.so_reuseport", int(reuse_port)),
            # Idle streams cost memory a client can pile up: one cap per connection, one on connections.
            ("grpc.max_concurrent_streams", config.grpc_max_concurrent_streams),
            ("grpc.max_allowed_incoming_connections", config.grpc_max_connections),
        ]
    )
    auth = CallContextReader(state.auth)
    gateway = TokenGatewayService(state, auth)
    passthrough = SchedulerPassthrough(state, auth)
    # Unparseable requests get INVALID_ARGUMENT, not grpcio's INTERNAL; too many values, RESOURCE_EXHAUSTED.
    register(gateway_pb2_grpc.add_TokenGatewayServicer_to_server, gateway, server, config.max_body_values)
    register(sglang_scheduler_pb2_grpc.add_SglangSchedulerServicer_to_server, passthrough, server, config.max_body_values)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (GATEWAY_SERVICE, SCHEDULER_SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    credentials = state.config.tls.grpc_credentials()  # TLS on the front door (--tls-cert-file)
    bound = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    if bound == 0:
        raise RuntimeError(f"gRPC server could not bind {address}")
    await server.start()
    out = GrpcServer(server, host, bound, health_servicer, gateway, passthrough)
    await out.set_serving(bool(state.registry.all()))
    log.info("gRPC front door on %s", out.target)
    return out
