"""A spy on the push relay: what each delivery handed to the client, from the worker's connection."""

from __future__ import annotations

import pytest


def record_pushes(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The texts each ``Generation.flush`` hands on, one list per delivery, while the test runs."""
    from gateway.pipeline.generation import Generation

    pushed: list[list[str]] = []
    flush = Generation.flush

    def spy(self: Generation) -> None:
        pushed.append(list(self._taken or []))
        flush(self)

    monkeypatch.setattr(Generation, "flush", spy)
    return pushed
