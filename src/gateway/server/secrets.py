"""API keys from files, so no key has to be on the command line (where ``ps`` shows it).

A key file holds one key per line; blank lines and ``#`` comments are skipped. That is
the shape of a Kubernetes or Docker secret mounted as a file. Keys may also come from
the environment (``TOKEN_GATEWAY_API_KEYS``, ``TOKEN_GATEWAY_ADMIN_API_KEY``,
``TOKEN_GATEWAY_WORKER_API_KEY``) like every other setting.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.settings import option


@dataclass
class SecretFilesConfig:
    api_key_file: str | None = option(None, "file of inference API keys, one per line (added to --api-keys)")
    admin_api_key_file: str | None = option(None, "file holding the admin API key (instead of --admin-api-key)")
    worker_api_key_file: str | None = option(None, "file holding the bearer token sent to workers (instead of --worker-api-key)")


class SecretFileError(ValueError):
    """A key file is missing, unreadable, empty, or conflicts with a key given directly."""


def read_keys(path: str) -> list[str]:
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except OSError as exc:
        raise SecretFileError(f"cannot read key file {path!r}: {exc.strerror or exc}") from None
    keys = [line.strip() for line in text.splitlines()]
    keys = [k for k in keys if k and not k.startswith("#")]
    if not keys:
        raise SecretFileError(f"key file {path!r} holds no key")
    return keys


def _one_key(path: str, flag: str) -> str:
    keys = read_keys(path)
    if len(keys) != 1:
        raise SecretFileError(f"{flag} {path!r} must hold exactly one key, found {len(keys)}")
    return keys[0]


def apply_secret_files(files: SecretFilesConfig, server: Any, security: Any) -> tuple[Any, Any]:
    """New ``(server, security)`` configs with the keys from ``files`` filled in."""
    if files.api_key_file:
        server = dataclasses.replace(server, api_keys=[*server.api_keys, *read_keys(files.api_key_file)])
    if files.worker_api_key_file:
        if server.worker_api_key:
            raise SecretFileError("give --worker-api-key or --worker-api-key-file, not both")
        server = dataclasses.replace(server, worker_api_key=_one_key(files.worker_api_key_file, "--worker-api-key-file"))
    if files.admin_api_key_file:
        if security.admin_api_key:
            raise SecretFileError("give --admin-api-key or --admin-api-key-file, not both")
        security = dataclasses.replace(security, admin_api_key=_one_key(files.admin_api_key_file, "--admin-api-key-file"))
    return server, security
