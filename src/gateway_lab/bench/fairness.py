"""`token-gateway bench fairness`: API keys sharing a saturated fleet.

The gateway and the fleet each run in their own process (as deployed), the driver in this one.

    token-gateway bench fairness --fleets sim sim-alt --queues off 1 1:1

For each fleet build and each admission setting (``--queues``: ``off``, the gateway does not
queue and the workers' first-come queues take the overload; ``H``, ``--fleet-headroom H``;
``H:R``, also ``--fair-reserve R``; ``H:R:B``, also ``--prefill-budget-tokens B``), on a fresh simulated fleet (its own
process) behind an in-process gateway with two API keys, three timed runs of gsp-shaped
requests (Poisson arrivals, shared prefixes, so locality still counts):

* *alone*: the light key by itself at ``light_rate``: its TTFT when nobody competes;
* *together*: the same light traffic while a heavy key sends ``heavy_factor`` times its
  rate, far past the fleet's capacity: the light key's TTFT p50 / p99 beside its alone
  figures (the goal: p99 within 1.5x), and what the heavy key and both keys got through
  (compare both: a fair queue serves light's whole rate, first-come service starves it);
* *shares*: two keys with weights ``share_weights`` both sending ``share_rate`` (each alone
  past capacity): each key's share of the requests completed while both are backlogged,
  divided by its weight's share (1.00 is exact; first-come service gives each key half,
  whatever the weights).

A light request's TTFT counts from the moment it was sent, so time in the gateway's
queue is part of it; one that never got a first token (timed out, refused) is reported
in the ok column and counts as infinitely slow in the percentiles.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import shlex
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.settings import add_options, from_namespace, option
from gateway_lab.bench.trace_bench import FLEETS, FleetShape

KEYS = ("light", "heavy")


@dataclass(slots=True)
class FairnessConfig:
    """The fleets, the gateway's queue settings and the offered load."""

    fleets: list[str] = option(list(FLEETS), "fleet builds to run on", choices=list(FLEETS))
    queues: list[str] = option(["off", "1", "1:1"], "admission settings to compare: off (no gateway queue), H (--fleet-headroom H), H:R (and --fair-reserve R) or H:R:B (and --prefill-budget-tokens B); a +NAME suffix adds the serve flag --NAME (1:3:512+gate-share-first)")
    shares: bool = option(True, "also run the shares run (two backlogged keys with --share-weights)")
    workers: int = option(4, "simulated workers per fleet")
    max_running: int = option(8, "running slots per worker (the fleet's own build is scaled to saturate on this machine)")
    time_scale_sim: float = option(10.0, "wall seconds per simulated second of the workers")
    policy: str = option("cache_aware", "routing policy")
    light_rate: float = option(3.0, "the light key's requests per second")
    heavy_factor: float = option(10.0, "the heavy key sends this many times the light key's rate")
    share_rate: float = option(30.0, "requests per second each key sends in the shares run")
    share_weights: list[float] = option([2.0, 1.0], "--key-weights of the two keys in the shares run")
    duration_s: float = option(30.0, "seconds of arrivals per run")
    grace_s: float = option(15.0, "seconds after the last arrival before the run is cut")
    groups: int = option(16, "gsp groups (shared system prompts) per key")
    system_tokens: int = option(512, "tokens of each group's system prompt")
    question_tokens: int = option(64, "tokens of each request's own question")
    output_tokens: int = option(32, "output tokens per request")
    seeds: list[int] = option([1], "workload seeds, one cell each: the light key's requests and arrivals (seed S), the heavy key's (S + 1), the shares run's keys' (S + 2, S + 3)")
    serve_args: str = option("", "more 'token-gateway serve' flags for the gateway, in one quoted string")
    json_out: str = option("", "write the figures as JSON to this file", flag="--json")
    markdown: str = option("", "write the table as Markdown to this file")
    requests_out: str = option("", "write one JSON line per request to this file (fleet, queue, seed, run, key, index, arrival, TTFT, worker, cached tokens), so one cell's requests can be set beside another's")

    def __post_init__(self) -> None:
        if len(self.share_weights) != 2 or min(self.share_weights) <= 0:
            raise ValueError("--share-weights takes two positive weights")
        for q in self.queues:
            parse_queue(q)
            queue_flags(q)
        if self.light_rate <= 0 or self.heavy_factor <= 0 or self.share_rate <= 0 or self.duration_s <= 0:
            raise ValueError("rates, factor and duration must be positive")
        if not self.seeds:
            raise ValueError("--seeds needs at least one seed")


def parse_queue(text: str) -> tuple[int, int, int]:
    """``off`` / ``H`` / ``H:R`` / ``H:R:B`` into (fleet headroom, fair reserve, prefill budget
    tokens); headroom -1 is off. ``+flag`` suffixes are :func:`queue_flags`'."""
    text = text.split("+", 1)[0]
    if text == "off":
        return -1, 0, 0
    parts = text.split(":")
    try:
        values = [int(p) for p in parts] if len(parts) <= 3 else [-1]
    except ValueError:
        values = [-1]
    if min(values) < 0:
        raise ValueError(f"--queues takes off, H, H:R or H:R:B with non-negative integers, got {text!r}")
    h, r, b = (*values, 0, 0)[:3]
    return h, r, b


def queue_flags(text: str) -> list[str]:
    """The serve flags a ``--queues`` setting's ``+name`` suffixes turn on (``1:3:512+gate-share-first``:
    ``--gate-share-first``), so a gateway rule can be set beside the same queue in one sitting."""
    names = text.split("+")[1:]
    for name in names:
        if not name or not all(part.isalnum() for part in name.split("-")):
            raise ValueError(f"--queues: a +suffix names a serve flag without its dashes, got {text!r}")
    return [f"--{name}" for name in names]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_options(parser.add_argument_group("fairness bench"), FairnessConfig)


# ---------------------------------------------------------------------------- figures


def ttft_percentile(results: Sequence[Any], q: float) -> float:
    """The q-th percentile TTFT of ``results``, a request without a first token counting as infinite."""
    values = sorted(r.ttft_s if r.ok and r.ttft_s is not None else math.inf for r in results)
    if not values:
        return math.nan
    rank = max(0, min(len(values) - 1, math.ceil(q / 100 * len(values)) - 1))
    return values[rank]


def shares(results: Mapping[str, Sequence[Any]], weights: dict[str, float], lo: float, hi: float) -> dict[str, float]:
    """Each key's share of the requests completed in ``[lo, hi)``, over its weight's share."""
    done = Counter(
        key for key, rs in results.items() for r in rs if r.ok and lo <= r.start_s + (r.latency_s or 0.0) < hi
    )
    total = sum(done.values())
    wsum = sum(weights.values())
    return {key: (done[key] / total) / (w / wsum) if total else math.nan for key, w in weights.items()}


@dataclass(slots=True)
class Cell:
    """One (fleet, headroom): the three runs' figures."""

    fleet: str
    queue: str
    seed: int = 1
    alone_p50: float = math.nan
    alone_p99: float = math.nan
    light_p50: float = math.nan
    light_p99: float = math.nan
    light_ok: str = ""
    heavy_done_per_s: float = 0.0
    all_done_per_s: float = 0.0  # both keys: what the fleet got through (a fair queue gives light its whole rate)
    share: dict[str, float] = dataclasses.field(default_factory=dict)
    hit_rate: float | None = None

    @property
    def ratio(self) -> float:
        return self.light_p99 / self.alone_p99 if self.alone_p99 > 0 else math.nan


def _ms(x: float) -> str:
    return "never" if math.isinf(x) else ("-" if math.isnan(x) else f"{1000 * x:,.0f}")


HEADER = [
    "fleet", "gateway queue (headroom:reserve)", "light alone TTFT p50 / p99 ms", "light beside heavy TTFT p50 / p99 ms",
    "p99 together / alone", "light ok", "heavy completed /s", "both keys completed /s", "shares / weight (w {a:g}, w {b:g})", "hit",
]  # fmt: skip


def header(config: FairnessConfig) -> list[str]:
    a, b = config.share_weights
    return [h.format(a=a, b=b) for h in HEADER]


def row(cell: Cell) -> list[str]:
    share = " / ".join("-" if math.isnan(v) else f"{v:.2f}" for v in cell.share.values()) or "-"
    queue = cell.queue if cell.seed == 1 else f"{cell.queue} (seed {cell.seed})"
    return [
        cell.fleet, queue,
        f"{_ms(cell.alone_p50)} / {_ms(cell.alone_p99)}", f"{_ms(cell.light_p50)} / {_ms(cell.light_p99)}",
        "-" if math.isnan(cell.ratio) else ("inf" if math.isinf(cell.ratio) else f"{cell.ratio:.2f}"),
        cell.light_ok, f"{cell.heavy_done_per_s:.1f}", f"{cell.all_done_per_s:.1f}", share,
        "-" if cell.hit_rate is None else f"{100 * cell.hit_rate:.1f}%",
    ]  # fmt: skip


def worker_index(worker_id: str | None, workers: Sequence[str]) -> int | str | None:
    """``worker_id`` as its place in the fleet's ``workers`` (ids or URLs, in the fleet's
    order), so the real bench's workers and the replay's compare; unknown: as it came."""
    if not worker_id:
        return None
    for i, w in enumerate(workers):
        if worker_id == w or worker_id == w.split("://", 1)[-1].rstrip("/"):
            return i
    return worker_id


def request_rows(cell: Cell, run: str, results: Mapping[str, Sequence[Any]], workers: Sequence[str]) -> list[dict[str, Any]]:
    """One row per request of ``cell``'s run ``run`` (alone, together, shares), by key and
    arrival order: what ``--requests-out`` writes. Fields a result lacks (the replay's
    admission and gate waits, the policy's reason) are left out."""
    rows = []
    for key, outs in results.items():
        for index, r in enumerate(outs):
            row: dict[str, Any] = {
                "fleet": cell.fleet, "queue": cell.queue, "seed": cell.seed, "run": run, "key": key, "index": index,
                "start_s": round(r.start_s, 6), "ok": r.ok,
                "ttft_s": None if r.ttft_s is None else round(r.ttft_s, 6),
                "latency_s": None if r.latency_s is None else round(r.latency_s, 6),
                "worker": worker_index(r.worker_id, workers), "prompt_tokens": r.prompt_tokens,
                "cached_tokens": r.cached_tokens,
            }  # fmt: skip
            for extra in ("admission_s", "gate_s", "reason"):
                value = getattr(r, extra, None)
                if value is not None:
                    row[extra] = round(value, 6) if isinstance(value, float) else value
            rows.append(row)
    return rows


def fresh_requests_out(config: FairnessConfig) -> None:
    """Empty ``--requests-out`` before a run's cells append to it."""
    if config.requests_out:
        with open(config.requests_out, "wb"):
            pass


def append_rows(path: str, rows: Sequence[dict[str, Any]]) -> None:
    """Append ``rows`` to ``path`` as JSON lines (nothing when ``path`` is empty)."""
    if not path or not rows:
        return
    import json

    with open(path, "a", encoding="utf-8") as out:
        out.writelines(json.dumps(row) + "\n" for row in rows)


# ---------------------------------------------------------------------------- runs


def tenant_workload(config: FairnessConfig, vocab: Any, rate: float, seed: int) -> Any:
    """gsp requests at Poisson ``rate`` for ``duration_s`` (a key's own groups: its own prefixes)."""
    from gateway_lab.bench.workloads import GspConfig, Workload, gsp, with_poisson_arrivals

    count = max(1, math.ceil(rate * config.duration_s))
    per_group = max(1, math.ceil(count / config.groups))
    sizes = GspConfig(groups=config.groups, prompts_per_group=per_group, system_tokens=config.system_tokens,
                      question_tokens=config.question_tokens, output_tokens=config.output_tokens)
    base = gsp(sizes, vocab, seed=seed)
    timed = with_poisson_arrivals(Workload(base.name, base.requests[:count], base.params), rate, seed=seed)
    return timed


async def drive(url: str, loads: dict[str, tuple[str, Any]], config: FairnessConfig) -> dict[str, list[Any]]:
    """Send each key's workload (key name -> (bearer key, workload)) at once; results by key name."""
    import httpx

    from gateway_lab.bench.driver import DriverConfig, run_workload

    driver = DriverConfig(
        concurrency=100_000, duration_s=config.duration_s + config.grace_s,
        request_timeout_s=config.duration_s + config.grace_s, model="",
    )  # fmt: skip
    clients = {
        name: httpx.AsyncClient(
            timeout=httpx.Timeout(driver.request_timeout_s, connect=10.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
            headers={"authorization": f"Bearer {key}"}, trust_env=False,
        )
        for name, (key, _) in loads.items()
    }  # fmt: skip
    try:
        runs = await asyncio.gather(
            *(run_workload(url, workload, driver, label=name, client=clients[name])
              for name, (_, workload) in loads.items())
        )  # fmt: skip
    finally:
        for client in clients.values():
            await client.aclose()
    return {name: run.results for name, run in zip(loads, runs, strict=True)}


async def run_cell(
    config: FairnessConfig, fleet: str, queue: str, vocab: Any, tokenizer_dir: str, scratch: str, seed: int = 1,
) -> Cell:
    from gateway_lab.bench import launch
    from gateway_lab.sim.config import SimConfig

    shape: FleetShape = FLEETS[fleet]
    sim = SimConfig(
        page_size=shape.page_size, kv_capacity_tokens=shape.kv_capacity_tokens, max_running_requests=config.max_running,
        step_base_s=shape.step_base_s, prefill_token_s=shape.prefill_token_s, decode_seq_s=shape.decode_seq_s,
        time_scale=config.time_scale_sim, seed=0,
    )  # fmt: skip
    light = tenant_workload(config, vocab, config.light_rate, seed=seed)
    heavy = tenant_workload(config, vocab, config.light_rate * config.heavy_factor, seed=seed + 1)
    share_a = tenant_workload(config, vocab, config.share_rate, seed=seed + 2)
    share_b = tenant_workload(config, vocab, config.share_rate, seed=seed + 3)
    cell = Cell(fleet, queue, seed)
    headroom, reserve, budget = parse_queue(queue)
    prompt = cached = 0

    async def one_run(loads: dict[str, tuple[str, Any]], weights: list[str], run: str) -> dict[str, list[Any]]:
        nonlocal prompt, cached
        args = [
            "--tokenizer-path", tokenizer_dir, "--tokenizer-cache-dir", scratch, "--log-level", "warning",
            "--api-keys", *[key for key, _ in loads.values()], "--fleet-headroom", str(headroom),
            "--fair-reserve", str(reserve), "--prefill-budget-tokens", str(budget), "--max-queued-requests", "100000",
            "--queue-timeout-s", str(config.duration_s + config.grace_s),
        ]  # fmt: skip
        if weights:
            args += ["--key-weights", *weights]
        args += queue_flags(queue) + shlex.split(config.serve_args)
        async with launch.fleet("process", config.workers, sim) as workers, launch.gateway(
            "ours", workers.urls, config.policy, extra_args=args, log_dir=scratch, ready_timeout_s=180.0
        ) as served:
            results = await drive(served.url, loads, config)
            append_rows(config.requests_out, request_rows(cell, run, results, workers.urls))
        for rs in results.values():
            for r in rs:
                if r.ok:
                    prompt += r.prompt_tokens
                    cached += r.cached_tokens
        return results

    alone = await one_run({"light": ("key-light", light)}, [], "alone")
    cell.alone_p50, cell.alone_p99 = ttft_percentile(alone["light"], 50), ttft_percentile(alone["light"], 99)
    together = await one_run({"light": ("key-light", light), "heavy": ("key-heavy", heavy)}, [], "together")
    cell.light_p50, cell.light_p99 = ttft_percentile(together["light"], 50), ttft_percentile(together["light"], 99)
    cell.light_ok = f"{sum(r.ok for r in together['light'])}/{len(light.requests)}"
    window = (config.duration_s / 3, config.duration_s)

    def done_per_s(results: Sequence[Any]) -> float:
        done = sum(1 for r in results if r.ok and window[0] <= r.start_s + (r.latency_s or 0) < window[1])
        return done / (window[1] - window[0])

    cell.heavy_done_per_s = done_per_s(together["heavy"])
    cell.all_done_per_s = cell.heavy_done_per_s + done_per_s(together["light"])
    if config.shares:
        wa, wb = config.share_weights
        both = await one_run({"a": ("key-a", share_a), "b": ("key-b", share_b)}, [f"key-a={wa:g}", f"key-b={wb:g}"], "shares")
        cell.share = shares(both, {"a": wa, "b": wb}, *window)
    cell.hit_rate = cached / prompt if prompt else None
    return cell


async def run_all(config: FairnessConfig, console: Any, tokenizer_dir: str) -> list[Cell]:
    import tempfile

    from gateway_lab.bench.workloads import Vocab

    vocab = Vocab.from_tokenizer_dir(tokenizer_dir)
    cells = []
    with tempfile.TemporaryDirectory(prefix="token-gateway-fairness-") as scratch:
        for fleet in config.fleets:
            for seed in config.seeds:
                for queue in config.queues:
                    start = time.monotonic()
                    cell = await run_cell(config, fleet, queue, vocab, tokenizer_dir, scratch, seed)
                    cells.append(cell)
                    console.print(" | ".join(row(cell)) + f"  ({time.monotonic() - start:.0f} s)")
    return cells


def config_of(args: argparse.Namespace) -> FairnessConfig:
    try:
        return from_namespace(FairnessConfig, args)
    except ValueError as exc:
        raise SystemExit(f"bad arguments: {exc}") from exc


def run(args: argparse.Namespace) -> int:
    from gateway_lab.bench import results
    from gateway_lab.bench.workloads import default_tokenizer_dir

    config = config_of(args)
    console = results.console(200)
    fresh_requests_out(config)
    cells = asyncio.run(run_all(config, console, str(default_tokenizer_dir())))
    return report(config, console, cells, "fairness")


def report(config: FairnessConfig, console: Any, cells: list[Cell], name: str) -> int:
    """The cells' table (and ``--json`` / ``--markdown``), titled ``name`` and the offered load."""
    from gateway_lab.bench.results import Result, Table, write

    result = Result()
    title = (f"{name}: light {config.light_rate:g}/s beside heavy x{config.heavy_factor:g}; "
             f"shares at {config.share_rate:g}/s each")  # fmt: skip
    result.tables.append(Table.of(title, header(config), [row(c) for c in cells]))
    result.data = {"fairness": dataclasses.asdict(config)}
    return write(result, console, json_path=config.json_out, markdown_path=config.markdown)
