"""The gRPC door caps what one client can hold open: streams per connection (advertised
in HTTP/2 SETTINGS) and connections."""

from __future__ import annotations

import asyncio
import contextlib

import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest

from tests.e2e.grpc.conftest import GrpcStack


async def _server_settings(host: str, port: int) -> dict[int, int] | None:
    """The server's first SETTINGS over a fresh HTTP/2 connection (None: closed first)."""
    reader, writer = await asyncio.open_connection(host, port)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    writer.write(conn.data_to_send())
    try:
        async with asyncio.timeout(5):
            while data := await reader.read(65536):
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.RemoteSettingsChanged):
                        return {k: v.new_value for k, v in event.changed_settings.items()}
        return None
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


@pytest.mark.stack(workers=1, server={"grpc_max_concurrent_streams": 7})
async def test_max_concurrent_streams_is_advertised(gstack: GrpcStack) -> None:
    host, port = gstack.target.rsplit(":", 1)
    settings = await _server_settings(host, int(port))
    assert settings is not None
    assert settings[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS] == 7


@pytest.mark.stack(workers=1, server={"grpc_max_connections": 2})
async def test_connections_past_the_cap_are_refused(gstack: GrpcStack) -> None:
    host, port = gstack.target.rsplit(":", 1)
    held = [await asyncio.open_connection(host, int(port)) for _ in range(2)]
    await asyncio.sleep(0.2)
    try:
        assert await _server_settings(host, int(port)) is None
    finally:
        for _, writer in held:
            writer.close()
    await asyncio.sleep(0.2)
    assert await _server_settings(host, int(port)) is not None  # room again once they closed
