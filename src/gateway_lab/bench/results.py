"""One result format for every benchmark: a typed record of what a run measured, and one
writer that prints it as a table and writes it as Markdown and JSON.

A ``Result`` holds one or more ``Table``s (a header and rows of already formatted cells),
notes (lines said after the tables: errors, verdicts, ideals), the scenario's raw figures for JSON (``data``,
written as they are), the machine it ran on, taken when the run started, and why the run
is invalid if it is. That last list is the one rule every benchmark exits by: a run with
failed requests, a stall or a process that died reports it with ``require`` (or
``count_failed``), and ``write`` says why and returns 1, so no scenario keeps its own rule
and none exits 0 on figures it cannot vouch for. (A gateway that dies mid-run is the
launcher's to catch: ``launch.gateway`` raises.) Every figure
in docs/BENCHMARKS.md names its command, machine and date: the writer always prints the
machine line, and the JSON always carries ``machine`` (with the load at the end) and each
table's rows keyed by its header.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway_lab.bench import machine


@dataclass(frozen=True, slots=True)
class Table:
    """A titled grid of formatted cells; the first ``labels`` columns name the row."""

    title: str
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    labels: int = 2
    # (row, column) cells shown in bold on a terminal (the best of a comparison)
    best: frozenset[tuple[int, int]] = frozenset()

    def __post_init__(self) -> None:
        for row in self.rows:
            if len(row) != len(self.header):
                raise ValueError(f"{self.title!r}: a row of {len(row)} cells under {len(self.header)} columns")

    @classmethod
    def of(cls, title: str, header: Sequence[str], rows: Sequence[Sequence[Any]], **options: Any) -> Table:
        return cls(title, tuple(header), tuple(tuple(str(c) for c in r) for r in rows), **options)

    def records(self) -> list[dict[str, str]]:
        """The rows as JSON objects keyed by the header."""
        return [dict(zip(self.header, row, strict=True)) for row in self.rows]

    def markdown(self) -> list[str]:
        lines = ["| " + " | ".join(self.header) + " |", "|" + "---|" * len(self.header)]
        return lines + ["| " + " | ".join(row) + " |" for row in self.rows]


@dataclass(slots=True)
class Result:
    """What one benchmark run measured."""

    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=machine.facts)
    # why the figures cannot be trusted; empty for a valid run
    invalid: list[str] = field(default_factory=list)

    def require(self, ok: bool, reason: str) -> None:
        """Mark the run invalid, for ``reason``, unless ``ok``."""
        if not ok:
            self.invalid.append(reason)

    def count_failed(self, label: str, failed: int, total: int) -> None:
        """A measured request that failed (an error, a timeout, a stalled stream) makes the run invalid."""
        self.require(failed == 0, f"{label}: {failed} of {total} requests failed")

    @property
    def exit_status(self) -> int:
        """The process's exit status for this run: 1 when invalid, else 0."""
        return 1 if self.invalid else 0

    def to_json(self) -> dict[str, Any]:
        """``{"machine", "rows", **data}``; with several tables ``rows`` is keyed by title."""
        rows: Any = [t.records() for t in self.tables]
        if len(self.tables) == 1:
            rows = rows[0]
        else:
            rows = {t.title: r for t, r in zip(self.tables, rows, strict=True)}
        end = {"load_avg_end": machine.facts()["load_avg"]}
        return {"machine": self.machine | end, "rows": rows, "invalid": list(self.invalid), **self.data}

    def markdown(self) -> str:
        """Each table (under a ``####`` heading of its title when there are several), then the
        notes and why the run is invalid (so an invalid table never passes for figures)."""
        blocks = []
        for table in self.tables:
            heading = [f"#### {table.title}", ""] if len(self.tables) > 1 else []
            blocks.append("\n".join(heading + table.markdown()))
        if self.notes or self.invalid:
            blocks.append("\n".join([*self.notes, *(f"INVALID run: {r}" for r in self.invalid)]))
        return "\n\n".join(blocks) + "\n"


def rich_table(table: Table) -> Any:
    """``table`` as a ``rich`` table: label columns left, figures right, best cells bold."""
    from rich.markup import escape
    from rich.table import Table as RichTable

    out = RichTable(title=table.title or None, title_justify="left")
    for i, name in enumerate(table.header):
        out.add_column(name, justify="left" if i < table.labels else "right")
    for r, row in enumerate(table.rows):
        cells = (escape(c) for c in row)
        out.add_row(*(f"[bold green]{c}[/]" if (r, i) in table.best else c for i, c in enumerate(cells)))
    return out


def console(width: int = 200) -> Any:
    """A ``rich`` console; writing to a file or a pipe (a log), ``width`` columns wide
    instead of 80, so the tables are not squeezed."""
    from rich.console import Console

    out = Console()
    return out if out.is_terminal else Console(width=width)


def write(result: Result, out: Any = None, *, json_path: str | Path = "", markdown_path: str | Path = "") -> int:
    """Print ``result`` (tables, notes, why it is invalid, machine line) on ``out`` (a ``rich``
    console), write it where asked, and return the run's exit status (``Result.exit_status``)."""
    screen = out if out is not None else console()
    for table in result.tables:
        screen.print(rich_table(table))
    for note in result.notes:
        screen.print(note, markup=False, highlight=False)
    for reason in result.invalid:
        screen.print(f"INVALID run: {reason}", markup=False, highlight=False, style="bold red")
    screen.print(f"machine: {machine.describe()}", markup=False, highlight=False)
    if markdown_path:
        Path(markdown_path).write_text(result.markdown())
    if json_path:
        Path(json_path).write_text(json.dumps(result.to_json(), indent=2))
    return result.exit_status
