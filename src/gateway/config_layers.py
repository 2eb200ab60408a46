"""Layered settings: command line > ``TOKEN_GATEWAY_*`` environment > config file > defaults.

The typed config dataclasses stay the one source of truth for names, types and
defaults (``gateway.settings.option``). This module builds a pydantic-settings
model from whichever dataclasses the parser holds, so every field, including
ones added later, is settable the same four ways:

- ``--port 8080`` (the command line: only flags actually given count);
- ``TOKEN_GATEWAY_PORT=8080`` (lists: a JSON array or comma-separated values);
- ``port = 8080`` in a TOML or YAML file given with ``--config`` (or
  ``TOKEN_GATEWAY_CONFIG``); keys are field names, dashes or underscores;
- the dataclass default.

pydantic-settings does the reading, decoding and type checking; this module only
wires the sources in that order and reports errors by their source.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import ValidationError, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
    YamlConfigSettingsSource,
)

from gateway.settings import explicit_flags, is_secret, option_classes

ENV_PREFIX = "TOKEN_GATEWAY_"
CONFIG_ENV = ENV_PREFIX + "CONFIG"
MASK = "***"
_SECRET_SUFFIXES = ("api_key", "api_keys", "password", "secret")

ValueMap = Callable[[str, Any], Any]  # (field name, value) -> value, for value aliases


class ConfigError(ValueError):
    """A setting from the environment or the config file is unknown or malformed."""


@dataclasses.dataclass(frozen=True)
class Extra:
    """A setting that is not a dataclass field (e.g. ``--prefill``, parsed by hand)."""

    type: Any
    default: Any
    secret: bool = False


def _option_fields(classes: Iterable[type]) -> dict[str, tuple[Any, dataclasses.Field[Any]]]:
    out: dict[str, tuple[Any, dataclasses.Field[Any]]] = {}
    for cls in classes:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if "help" in f.metadata:
                out[f.name] = (hints[f.name], f)
    return out


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory()  # type: ignore[misc,operator]


def _with_choices(tp: Any, choices: list[str] | None) -> Any:
    if not choices:
        return tp
    lit = Literal[tuple(choices)]  # type: ignore[valid-type]
    if type(None) in typing.get_args(tp):
        return lit | None
    return lit


def _is_list(tp: Any) -> bool:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return any(_is_list(a) for a in typing.get_args(tp) if a is not type(None))
    return typing.get_origin(tp) is list


def split_list(value: str) -> list[str]:
    """An environment list: a JSON array, else comma- (or space-) separated items."""
    text = value.strip()
    if text.startswith("["):
        loaded = json.loads(text)
        if not isinstance(loaded, list):
            raise ValueError("expected a JSON array")
        return [str(v) for v in loaded]
    sep = "," if "," in text else None
    return [item.strip() for item in text.split(sep) if item.strip()]


class _NormalizedFile(PydanticBaseSettingsSource):
    """A TOML/YAML file source whose keys may use dashes (like the flags)."""

    def __init__(self, settings_cls: type[BaseSettings], inner: PydanticBaseSettingsSource) -> None:
        super().__init__(settings_cls)
        self._inner = inner

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ answers for the whole file

    def __call__(self) -> dict[str, Any]:
        data = self._inner()
        if not isinstance(data, dict):
            raise ConfigError("the config file must hold a table/mapping of settings")
        return {str(k).replace("-", "_"): v for k, v in data.items()}


class _Layered(BaseSettings):
    """Base of the generated model; subclasses set the file and the list fields."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="forbid", enable_decoding=False, case_sensitive=False,
    )
    config_file: ClassVar[Path | None] = None
    list_fields: ClassVar[frozenset[str]] = frozenset()
    value_map: ClassVar[ValueMap | None] = None

    @model_validator(mode="before")
    @classmethod
    def _decode(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        out = {}
        for key, value in data.items():
            if key in cls.list_fields and isinstance(value, str):
                value = split_list(value)
            if cls.value_map is not None:
                value = cls.value_map(key, value)
            out[key] = value
        return out

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = cls.config_file
        if path is not None:
            inner: PydanticBaseSettingsSource
            if path.suffix.lower() == ".toml":
                inner = TomlConfigSettingsSource(settings_cls, toml_file=path)
            else:
                inner = YamlConfigSettingsSource(settings_cls, yaml_file=path)
            sources.append(_NormalizedFile(settings_cls, inner))
        return tuple(sources)


def _check_file(path: Path) -> None:
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    if path.suffix.lower() not in (".toml", ".yaml", ".yml"):
        raise ConfigError(f"config file {str(path)!r}: use a .toml, .yaml or .yml file")


def _describe(errors: list[Any], explicit: Mapping[str, Any], path: Path | None, known: Iterable[str] = ()) -> str:
    lines = []
    for err in errors:
        name = str(err["loc"][0]) if err["loc"] else "?"
        if name in explicit:
            where = "command line"
        elif (ENV_PREFIX + name).upper() in {k.upper() for k in os.environ}:
            where = f"environment {ENV_PREFIX}{name.upper()}"
        else:
            where = f"config file {path}" if path else "settings"
        if err["type"] == "extra_forbidden":
            close = difflib.get_close_matches(name, list(known), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            lines.append(f"{where}: unknown setting {name!r}{hint}")
        else:
            lines.append(f"{where}: {name}: {err['msg']} (got {err.get('input')!r})")
    return "; ".join(lines)


def resolve(
    args: argparse.Namespace,
    *,
    config_file: str | None = None,
    extras: Mapping[str, Extra] | None = None,
    value_map: ValueMap | None = None,
) -> dict[str, Any]:
    """Every setting's value, flag > env > file > default; written back onto ``args``."""
    extras = dict(extras or {})
    fields = _option_fields(option_classes(args))
    spec: dict[str, Any] = {}
    lists: set[str] = set()
    for name, (tp, f) in fields.items():
        spec[name] = (_with_choices(tp, f.metadata.get("choices")), _default(f))
        if _is_list(tp):
            lists.add(name)
    for name, extra in extras.items():
        spec[name] = (extra.type, extra.default)
        if _is_list(extra.type):
            lists.add(name)
    path_text = config_file or os.environ.get(CONFIG_ENV) or None
    path = Path(path_text).expanduser() if path_text else None
    if path is not None:
        _check_file(path)
    model = _build_model(spec, path, frozenset(lists), value_map)
    given = explicit_flags(args)
    explicit = {name: getattr(args, name) for name in spec if name in given}
    try:
        settings = model(**explicit)
    except ValidationError as exc:
        raise ConfigError(_describe(exc.errors(), explicit, path, spec)) from None
    except (ValueError, OSError) as exc:  # a file that does not parse
        raise ConfigError(f"config file {path}: {exc}") from None
    values = settings.model_dump()
    for name, value in values.items():
        setattr(args, name, value)
    return values


def _build_model(
    spec: dict[str, Any], path: Path | None, lists: frozenset[str], value_map: ValueMap | None
) -> type[_Layered]:
    from pydantic import create_model

    bound = type(
        "_Bound", (_Layered,),
        {"config_file": path, "list_fields": lists, "value_map": staticmethod(value_map) if value_map else None},
    )
    return create_model("GatewaySettings", __base__=bound, **spec)  # type: ignore[no-any-return,call-overload]


# TOKEN_GATEWAY_* variables that are not settings: set by the gateway for its own
# children (serve --processes) or read by one module (heap tracing).
INTERNAL_ENV = frozenset({"CONFIG", "TRACEMALLOC_DIR", "PROCESS_INDEX", "PROCESS_COUNT", "RUN_DIR", "HTTP_FD"})


def unknown_env(args: argparse.Namespace, extras: Mapping[str, Extra] | None = None) -> list[str]:
    """``TOKEN_GATEWAY_*`` variables that name no setting (a typo is otherwise silent)."""
    known = set(_option_fields(option_classes(args))) | set(extras or {})
    out = []
    for key in os.environ:
        if key.upper().startswith(ENV_PREFIX):
            name = key[len(ENV_PREFIX):]
            if name.lower() not in known and name.upper() not in INTERNAL_ENV:
                out.append(key)
    return sorted(out)


def secret_names(args: argparse.Namespace, extras: Mapping[str, Extra] | None = None) -> set[str]:
    """Settings whose values are masked when shown."""
    names = {n for n, (_, f) in _option_fields(option_classes(args)).items() if is_secret(f)}
    names |= {n for n, e in (extras or {}).items() if e.secret}
    names |= {n for n in _option_fields(option_classes(args)) if n.endswith(_SECRET_SUFFIXES)}
    return names


def masked(values: Mapping[str, Any], secrets: set[str]) -> dict[str, Any]:
    """``values`` with every set secret replaced by ``***``."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        if name in secrets and value:
            out[name] = [MASK for _ in value] if isinstance(value, list) else MASK
        else:
            out[name] = value
    return out
