"""API keys from files and the environment; `serve --print-config` masks them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gateway.cli import build_parser
from gateway.server.secrets import SecretFileError, read_keys
from gateway.server.serve import config_from_args


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("TOKEN_GATEWAY_"):
            monkeypatch.delenv(key)


def _config(argv: list[str]):  # type: ignore[no-untyped-def]
    return config_from_args(build_parser().parse_args(["serve", *argv]))


def test_key_files(tmp_path: Path) -> None:
    (tmp_path / "keys").write_text("# inference keys\nk1\n\n  k2  \n")
    (tmp_path / "admin").write_text("adm\n")
    (tmp_path / "worker").write_text("wrk")
    c = _config(["--api-keys", "k0", "--api-key-file", str(tmp_path / "keys"),
                 "--admin-api-key-file", str(tmp_path / "admin"), "--worker-api-key-file", str(tmp_path / "worker")])
    assert c.server.api_keys == ["k0", "k1", "k2"]
    assert c.security.admin_api_key == "adm"
    assert c.server.worker_api_key == "wrk"


def test_keys_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKEN_GATEWAY_API_KEYS", "a,b")
    monkeypatch.setenv("TOKEN_GATEWAY_ADMIN_API_KEY", "adm")
    c = _config([])
    assert c.server.api_keys == ["a", "b"] and c.security.admin_api_key == "adm"


def test_bad_key_files(tmp_path: Path) -> None:
    with pytest.raises(SecretFileError, match="cannot read"):
        read_keys(str(tmp_path / "missing"))
    (tmp_path / "empty").write_text("# nothing\n\n")
    with pytest.raises(SecretFileError, match="holds no key"):
        read_keys(str(tmp_path / "empty"))
    (tmp_path / "two").write_text("a\nb\n")
    with pytest.raises(SecretFileError, match="exactly one"):
        _config(["--admin-api-key-file", str(tmp_path / "two")])
    (tmp_path / "one").write_text("a\n")
    with pytest.raises(SecretFileError, match="not both"):
        _config(["--admin-api-key", "x", "--admin-api-key-file", str(tmp_path / "one")])


def _serve(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    base = {k: v for k, v in os.environ.items() if not k.startswith("TOKEN_GATEWAY_")}
    return subprocess.run([sys.executable, "-m", "gateway", "serve", *argv], capture_output=True, text=True,
                          timeout=60, env={**base, **(env or {})})


def test_print_config_masks_secrets_and_round_trips(tmp_path: Path) -> None:
    cfg = tmp_path / "gw.toml"
    cfg.write_text('admin_api_key = "file-secret"\nport = 4000\npolicy = "round_robin"\n')
    done = _serve(["--config", str(cfg), "--print-config", "--max-attempts", "2"],
                  {"TOKEN_GATEWAY_API_KEYS": "env-secret-1,env-secret-2", "TOKEN_GATEWAY_PORT": "4001"})
    assert done.returncode == 0, done.stderr
    assert "secret" not in done.stdout
    shown = yaml.safe_load(done.stdout)
    assert "admin_api_key" not in shown and "api_keys" not in shown  # set secrets: named in comments only
    assert "# admin_api_key: set, not printed" in done.stdout and "# api_keys: set, not printed" in done.stdout
    assert (shown["port"], shown["policy"], shown["max_attempts"]) == (4001, "round_robin", 2)
    # the output is itself a valid config file, as printed
    again = tmp_path / "again.yaml"
    again.write_text(done.stdout)
    second = _serve(["--config", str(again), "--print-config"])
    assert second.returncode == 0, second.stderr
    assert yaml.safe_load(second.stdout)["port"] == 4001


def test_bad_settings_exit_2_with_the_source(tmp_path: Path) -> None:
    done = _serve(["--print-config"], {"TOKEN_GATEWAY_PORT": "eighty"})
    assert done.returncode == 2 and "TOKEN_GATEWAY_PORT" in done.stderr
    done = _serve(["--print-config", "--api-key-file", str(tmp_path / "missing")])
    assert done.returncode == 2 and "cannot read key file" in done.stderr
