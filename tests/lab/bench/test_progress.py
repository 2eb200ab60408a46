"""Progress bars of bench run / bench matrix: requests done, errors, cells."""

from __future__ import annotations

import io
from types import SimpleNamespace

from rich.console import Console

from gateway_lab.bench.progress import BenchProgress


def test_counts_requests_errors_and_cells() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    with BenchProgress(console, cells=2) as bars:
        on_result = bars.run("gsp x2 ours cache_aware", 3)
        for ok in (True, False, True):
            on_result(SimpleNamespace(ok=ok))
        bars.cell_done()
        task = next(t for t in bars.progress.tasks if t.description.startswith("gsp"))
        assert (task.completed, task.total, bars.errors) == (3, 3, 1)
        again = bars.run("chat x2 ours cache_aware", 2)  # the next cell replaces the run bar
        again(SimpleNamespace(ok=True))
        bars.cell_done()
        descriptions = [t.description for t in bars.progress.tasks]
        assert descriptions == ["cells", "chat x2 ours cache_aware"]
        assert bars.progress.tasks[0].completed == 2
    text = out.getvalue()
    assert "chat x2 ours cache_aware" in text and "1/2" in text
