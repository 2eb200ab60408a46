"""The HTTP server's connection limits (enforced by ``server.http.guard``), kept light for ``--help``."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.settings import check_at_least, option


@dataclass
class HttpLimitsConfig:
    max_header_bytes: int = option(64 * 1024, "largest request head (request line and headers) accepted, bytes; more gets 431")
    max_headers: int = option(128, "most header lines per request; more gets 431")
    header_timeout_s: float = option(10.0, "time a client has to send a request's whole head, seconds; then 408")
    body_timeout_s: float = option(60.0, "time a client has to send a request's whole body after its head, seconds; then 408")
    max_pending_body_bytes: int = option(
        256 * 1024 * 1024,
        "most bytes of request bodies still arriving, all connections together; the connection whose body "
        "passes it gets 503 and is closed (0: no bound)",
    )

    def __post_init__(self) -> None:
        check_at_least(self, 0, "max_pending_body_bytes", "header_timeout_s", "body_timeout_s", "keep_alive_timeout_s")
        check_at_least(self, 1, "max_header_bytes", "max_headers")
    # Longer than the pools of common clients (httpx and the openai SDK drop idle connections
    # after 5 s): the client must be the side that closes an idle connection. A server that
    # closes first races the client's next request on it, which then fails with no response.
    keep_alive_timeout_s: float = option(
        75.0, "idle keep-alive connections are closed after this long, seconds (keep it above clients' pool expiry)"
    )
