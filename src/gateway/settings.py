"""Typed configuration: dataclasses are the one source of truth for defaults.

Every config dataclass declares its fields with ``option(default, "help")``;
``add_options`` turns those fields into argparse flags whose ``--help`` shows
each default, and ``from_namespace`` builds the dataclass back from parsed args.

The flags ``add_options`` makes remember whether they were given (``explicit_flags``)
and the parser remembers which dataclasses it holds (``option_classes``), so
``gateway.config_layers`` can layer environment variables and a config file under
the command line for every field, including ones added later.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")

EXPLICIT = "_explicit_flags"  # namespace attribute: dests given on the command line
OPTION_CLASSES = "_option_classes"  # parser default: the dataclasses add_options added


def option(
    default: Any,
    help: str,
    *,
    flag: str | None = None,
    choices: list[str] | None = None,
    secret: bool = False,
) -> Any:
    """A dataclass field that knows its command-line help (and optional flag name).

    ``secret`` fields (keys, passwords) are masked wherever the configuration is shown."""
    meta = {"help": help, "flag": flag, "choices": choices, "secret": secret}
    if isinstance(default, list | dict | set):
        factory = type(default)(default)
        return dataclasses.field(default_factory=lambda: type(factory)(factory), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def default_tokenizer_cache() -> str:
    """``$XDG_CACHE_HOME/token-gateway/tokenizers`` (``~/.cache/...`` without it), never a
    folder under whatever directory the gateway happens to start in."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "token-gateway", "tokenizers")


def check_at_least(config: Any, least: float, *names: str) -> None:
    """Refuse (ValueError, one line naming the flag) a setting below ``least``: a negative
    or zero limit would either refuse everything or bound nothing."""
    for name in names:
        value = getattr(config, name)
        if value is not None and value < least:
            raise ValueError(f"--{name.replace('_', '-')} must be at least {least:g}, got {value:g}")


def mark_explicit(namespace: argparse.Namespace, dest: str) -> None:
    """Record that ``dest`` was given on the command line (it then beats env and file)."""
    given = getattr(namespace, EXPLICIT, None)
    if given is None:
        given = set()
        setattr(namespace, EXPLICIT, given)
    given.add(dest)


def explicit_flags(namespace: argparse.Namespace) -> set[str]:
    return set(getattr(namespace, EXPLICIT, None) or ())


class _StoreTracked(argparse._StoreAction):
    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option_string: str | None = None) -> None:
        super().__call__(parser, namespace, values, option_string)
        mark_explicit(namespace, self.dest)


class _BoolTracked(argparse.BooleanOptionalAction):
    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option_string: str | None = None) -> None:
        super().__call__(parser, namespace, values, option_string)
        mark_explicit(namespace, self.dest)


def option_classes(namespace: argparse.Namespace) -> list[type]:
    """The config dataclasses whose flags the parser of ``namespace`` held."""
    return list(getattr(namespace, OPTION_CLASSES, None) or ())


def is_secret(field: dataclasses.Field[Any]) -> bool:
    return bool(field.metadata.get("secret"))


def _flag(field: dataclasses.Field[Any]) -> str:
    return field.metadata.get("flag") or "--" + field.name.replace("_", "-")


def _scalar_type(tp: Any) -> tuple[Any, bool, bool]:
    """(element type, is_list, is_optional) for a field annotation."""
    origin = typing.get_origin(tp)
    optional = False
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        optional = len(args) != len(typing.get_args(tp))
        tp = args[0]
        origin = typing.get_origin(tp)
    if origin is list:
        return typing.get_args(tp)[0], True, optional
    return tp, False, optional


def add_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type) -> None:
    """Add one flag per field of dataclass ``cls`` to ``parser``."""
    known = parser.get_default(OPTION_CLASSES) or []
    parser.set_defaults(**{OPTION_CLASSES: [*known, cls]})  # groups share the parser's defaults
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if "help" not in field.metadata:
            continue
        elem, is_list, _ = _scalar_type(hints[field.name])
        default = (
            field.default
            if field.default is not dataclasses.MISSING
            else field.default_factory()  # type: ignore[misc,operator]
        )
        kwargs: dict[str, Any] = {"dest": field.name, "help": field.metadata["help"], "default": default}
        if field.metadata.get("choices"):
            kwargs["choices"] = field.metadata["choices"]
        if elem is bool and not is_list:
            kwargs["action"] = _BoolTracked
        else:
            kwargs["action"] = _StoreTracked
            kwargs["type"] = elem
            if is_list:
                kwargs["nargs"] = "*"
        parser.add_argument(_flag(field), **kwargs)


def from_namespace(cls: type[T], ns: argparse.Namespace, **overrides: Any) -> T:
    """Build ``cls`` from the parsed flags (fields without a flag keep defaults)."""
    values = {f.name: getattr(ns, f.name) for f in dataclasses.fields(cls) if hasattr(ns, f.name)}  # type: ignore[arg-type]
    values.update(overrides)
    return cls(**values)
