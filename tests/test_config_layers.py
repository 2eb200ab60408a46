"""Settings layering: flag > TOKEN_GATEWAY_* environment > config file (TOML/YAML) > default."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from gateway.config_layers import ConfigError, masked, resolve, secret_names, split_list
from gateway.settings import add_options, explicit_flags, from_namespace, option


@dataclasses.dataclass
class _Knobs:
    port: int = option(30000, "port")
    ratio: float = option(0.5, "ratio")
    name: str | None = option(None, "name")
    urls: list[str] = option([], "urls")
    fast: bool = option(False, "fast")
    mode: str = option("a", "mode", choices=["a", "b"])
    admin_api_key: str | None = option(None, "key")


def _args(argv: list[str], *classes: type) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    for cls in classes or (_Knobs,):
        add_options(parser.add_argument_group(cls.__name__), cls)
    return parser.parse_args(argv)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("TOKEN_GATEWAY_"):
            monkeypatch.delenv(key)


def test_defaults_when_nothing_is_set() -> None:
    args = _args([])
    resolve(args)
    assert from_namespace(_Knobs, args) == _Knobs()


def test_precedence_flag_over_env_over_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "gw.toml"
    cfg.write_text('port = 1\nratio = 0.25\nname = "file"\nurls = ["grpc://f:1"]\n')
    monkeypatch.setenv("TOKEN_GATEWAY_PORT", "2")
    monkeypatch.setenv("TOKEN_GATEWAY_RATIO", "0.75")
    args = _args(["--port", "3"])
    resolve(args, config_file=str(cfg))
    got = from_namespace(_Knobs, args)
    assert got.port == 3  # flag
    assert got.ratio == 0.75  # env beats file
    assert got.name == "file"  # file beats default
    assert got.urls == ["grpc://f:1"]
    assert got.mode == "a"  # default


def test_a_flag_equal_to_its_default_still_beats_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKEN_GATEWAY_PORT", "2")
    args = _args(["--port", "30000"])
    assert explicit_flags(args) == {"port"}
    resolve(args)
    assert args.port == 30000


def test_yaml_file_with_dashed_keys(tmp_path: Path) -> None:
    cfg = tmp_path / "gw.yaml"
    cfg.write_text("port: 5\nadmin-api-key: s3cret\nfast: true\nmode: b\n")
    args = _args([])
    resolve(args, config_file=str(cfg))
    got = from_namespace(_Knobs, args)
    assert (got.port, got.admin_api_key, got.fast, got.mode) == (5, "s3cret", True, "b")


def test_config_file_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "gw.yml"
    cfg.write_text("port: 6\n")
    monkeypatch.setenv("TOKEN_GATEWAY_CONFIG", str(cfg))
    args = _args([])
    resolve(args)
    assert args.port == 6


@pytest.mark.parametrize(("raw", "want"), [
    ("grpc://a:1,grpc://b:2", ["grpc://a:1", "grpc://b:2"]),
    ('["grpc://a:1", "grpc://b:2"]', ["grpc://a:1", "grpc://b:2"]),
    ("grpc://a:1 grpc://b:2", ["grpc://a:1", "grpc://b:2"]),
    ("", []),
])
def test_env_lists(raw: str, want: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKEN_GATEWAY_URLS", raw)
    args = _args([])
    resolve(args)
    assert args.urls == want
    assert split_list(raw) == want


@pytest.mark.parametrize(("raw", "want"), [("1", True), ("true", True), ("no", False), ("0", False)])
def test_env_booleans(raw: str, want: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKEN_GATEWAY_FAST", raw)
    args = _args([])
    resolve(args)
    assert args.fast is want


def test_bad_env_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKEN_GATEWAY_PORT", "eighty")
    with pytest.raises(ConfigError, match=r"TOKEN_GATEWAY_PORT.*port"):
        resolve(_args([]))


def test_choices_hold_for_env_and_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKEN_GATEWAY_MODE", "c")
    with pytest.raises(ConfigError, match="mode"):
        resolve(_args([]))


def test_unknown_key_in_file_is_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "gw.toml"
    cfg.write_text("prot = 1\n")
    with pytest.raises(ConfigError, match="unknown setting 'prot'"):
        resolve(_args([]), config_file=str(cfg))


def test_an_unknown_key_close_to_a_setting_gets_a_suggestion(tmp_path: Path) -> None:
    cfg = tmp_path / "gw.toml"
    cfg.write_text("prot = 1\n")
    with pytest.raises(ConfigError) as err:
        resolve(_args([]), config_file=str(cfg))
    assert "unknown setting 'prot' (did you mean 'port'?)" in str(err.value)


def test_missing_or_unparsable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        resolve(_args([]), config_file=str(tmp_path / "nope.toml"))
    bad = tmp_path / "bad.toml"
    bad.write_text("port = = 1\n")
    with pytest.raises(ConfigError, match=r"bad\.toml"):
        resolve(_args([]), config_file=str(bad))
    other = tmp_path / "gw.ini"
    other.write_text("port=1\n")
    with pytest.raises(ConfigError, match="toml"):
        resolve(_args([]), config_file=str(other))


def test_a_new_field_is_picked_up_without_any_registration(monkeypatch: pytest.MonkeyPatch) -> None:
    @dataclasses.dataclass
    class Later:
        brand_new_knob_s: float = option(1.0, "added by another engineer later")

    monkeypatch.setenv("TOKEN_GATEWAY_BRAND_NEW_KNOB_S", "2.5")
    args = _args([], _Knobs, Later)
    resolve(args)
    assert from_namespace(Later, args).brand_new_knob_s == 2.5


def test_secrets_are_masked() -> None:
    args = _args(["--admin-api-key", "k", "--name", "visible"])
    values = resolve(args)
    shown = masked(values, secret_names(args))
    assert shown["admin_api_key"] == "***" and shown["name"] == "visible"
    assert "k" not in str({k: v for k, v in shown.items() if k != "mode"}.values())


def test_unknown_environment_variables_are_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.config_layers import unknown_env

    monkeypatch.setenv("TOKEN_GATEWAY_PROT", "1")  # a typo
    monkeypatch.setenv("TOKEN_GATEWAY_PORT", "2")
    monkeypatch.setenv("TOKEN_GATEWAY_TRACEMALLOC_DIR", "/somewhere")  # internal, not a setting
    args = _args([])
    resolve(args)
    assert args.port == 2
    assert unknown_env(args) == ["TOKEN_GATEWAY_PROT"]
