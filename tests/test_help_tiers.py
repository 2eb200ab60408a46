"""``help_tiers``: ``--help`` lists the chosen flags (their groups only), ``--help-all``
every flag, and a chosen flag the parser lacks is refused."""

from __future__ import annotations

import argparse

import pytest

from gateway import help_tiers


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tool")
    basics = parser.add_argument_group("basics")
    basics.add_argument("--port", type=int, default=1, help="the port")
    basics.add_argument("--tune-a", type=int, default=2, help="a knob")
    knobs = parser.add_argument_group("knobs")
    knobs.add_argument("--tune-b", type=int, default=3, help="another knob")
    parser.add_argument("--secret-alias", help=argparse.SUPPRESS)
    help_tiers.install(parser, ["--port"])
    return parser


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        _parser().parse_args(argv)
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def test_help_lists_the_chosen_flags_and_drops_empty_groups(capsys: pytest.CaptureFixture[str]) -> None:
    text = _help(["--help"], capsys)
    assert "--port" in text and "--help-all" in text and "basics:" in text
    assert "--tune-a" not in text and "--tune-b" not in text and "knobs:" not in text
    assert "--secret-alias" not in text
    assert _help(["-h"], capsys) == text
    assert "TOKEN_GATEWAY_" in text  # says where the other knobs are set


def test_help_all_lists_every_flag_grouped(capsys: pytest.CaptureFixture[str]) -> None:
    text = _help(["--help-all"], capsys)
    assert all(flag in text for flag in ("--port", "--tune-a", "--tune-b", "basics:", "knobs:"))
    assert "--secret-alias" not in text


def test_the_short_help_leaves_the_parser_as_it_was(capsys: pytest.CaptureFixture[str]) -> None:
    parser = _parser()
    before = parser.format_help()
    assert "--tune-a" not in help_tiers.operator_help(parser, frozenset({"--port"}))
    assert parser.format_help() == before
    args = parser.parse_args(["--tune-b", "9"])
    assert (args.port, args.tune_a, args.tune_b) == (1, 2, 9)


def test_a_chosen_flag_the_parser_lacks_is_refused() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port")
    with pytest.raises(ValueError, match="--prot"):
        help_tiers.install(parser, ["--port", "--prot"])
