"""Progress bars for ``bench run`` and ``bench matrix`` (rich), fed by the driver's
``on_result`` callback: requests done of planned, errors so far, elapsed and ETA.

On a terminal the bars redraw in place; in a log file rich prints no redraws, so
logs stay clean. Lines printed through the same console appear above the bars.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class BenchProgress:
    def __init__(self, console: Console, *, cells: int | None = None) -> None:
        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[errors]}"), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
            console=console, transient=False,
        )
        self._cells: TaskID | None = None
        self._cell_total = cells
        self._run: TaskID | None = None
        self.errors = 0

    def __enter__(self) -> BenchProgress:
        self.progress.start()
        if self._cell_total:
            self._cells = self.progress.add_task("cells", total=self._cell_total, errors="")
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.progress.stop()

    def run(self, label: str, total: int) -> Callable[[Any], None]:
        """Start the bar of one run of ``total`` requests; returns the driver's ``on_result``."""
        if self._run is not None:
            self.progress.remove_task(self._run)
        self.errors = 0
        task = self.progress.add_task(label, total=total, errors="")
        self._run = task

        def on_result(result: Any) -> None:
            if not getattr(result, "ok", True):
                self.errors += 1
            self.progress.update(task, advance=1, errors=f"[red]{self.errors} errors[/]" if self.errors else "")

        return on_result

    def cell_done(self) -> None:
        if self._cells is not None:
            self.progress.advance(self._cells)
