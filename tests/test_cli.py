"""`token-gateway` top level: --version, and --help without doubled or empty defaults."""

from __future__ import annotations

import re

import pytest

from gateway import __version__
from gateway.cli import COMMANDS, build_parser


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"token-gateway {__version__}"


@pytest.mark.parametrize("command", list(COMMANDS))
def test_help_defaults_once_and_never_empty(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    text = re.sub(r"\s+", " ", capsys.readouterr().out)
    assert "(default: )" not in text
    assert "(default: None)" not in text
    assert "(default: [])" not in text
    assert not re.search(r"\(default: [^)]*\) \(default:", text), text
