"""`token-gateway bench matrix`: every policy on every workload on fleets of several sizes.

Each cell (workload, fleet size, policy) gets a *fresh* simulated fleet (cold, equal
caches), a gateway with that policy, and the same seeded workload; the figures are
the ones the demo reports (hit rate next to the workload's ideal, output tokens/s,
TTFT p50/p99) plus what the simulated GPUs did (busy seconds, the busiest worker
against the mean).

Everything runs in this process: the fleet, the gateway (real HTTP on loopback) and the
driver. That is what lets the ``oracle`` policy read every worker's true radix cache
at decision time (``policies.oracle``), and it keeps every cell on the same footing. The
price is one Python process for all three, so on a small machine wall-clock figures are
partly CPU-bound: compare policies within a run, not runs across machines. The
simulated busy seconds do not depend on the CPU.

Workload sizes are fixed across fleet sizes; concurrency and nothing else grows with
the fleet (``--per-worker-concurrency``), so a bigger fleet shares the same prompts
among more caches: how routing's benefit scales with worker count.

``--peers smg`` adds, for gsp (or ``--peer-workload chat``: the multi-turn chat) at
``--peer-workers`` workers, the peer gateway (installed by ``scripts/peers.sh``) next to
ours, both as child processes over the same in-process fleet, with text prompts (the peer
takes no token-id prompts); ``--peer-rounds 2`` runs them a second time in the other order,
and a stall line per round says whether either stalled.

``--worker-transport http`` builds every cell's fleet from the simulator's SGLang HTTP
workers instead of its gRPC ones: ours sends them the routed token ids on ``/generate``, a
peer forwards the OpenAI request (text) to their ``/v1/completions`` or
``/v1/chat/completions``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.settings import add_options, from_namespace, option
from gateway_lab.bench import launch, results
from gateway_lab.bench.launch import knob_flags, parse_variant
from gateway_lab.bench.results import Result, Table, write
from gateway_lab.bench.workloads import ChatConfig, GspConfig, LongMixConfig, ZipfGspConfig

MATRIX_WORKLOADS = ["gsp", "chat", "long-mix", "zipf-gsp"]
MATRIX_POLICIES = ["round_robin", "random", "power_of_two", "least_load", "prefix_hash", "cache_aware", "oracle"]

# Defaults sized so the full matrix (3 workloads x 3 fleets x 7 policies) takes ~15-20
# minutes on a loaded 2-core machine. Each prompt's shared part is long (cheap for the
# CPU, expensive for the simulated GPU) and outputs are short (every output token costs
# CPU in three places).
MATRIX_GSP = GspConfig(groups=32, prompts_per_group=12, system_tokens=1536, question_tokens=64, output_tokens=8)
MATRIX_CHAT = ChatConfig(conversations=24, turns=5, chat_system_tokens=512, user_tokens=64, reply_tokens=8)
MATRIX_LONG = LongMixConfig(
    long_prompts=12, long_repeats=4, long_min_tokens=3072, long_max_tokens=6144, short_prompts=96,
    short_min_tokens=64, short_max_tokens=512, mix_question_tokens=32, mix_output_tokens=8,
)  # fmt: skip


@dataclass(slots=True)
class MatrixConfig:
    """Which cells to run, the simulated fleet, and where the figures go."""

    workloads: list[str] = option(MATRIX_WORKLOADS[:3], "workloads to run", choices=MATRIX_WORKLOADS)
    workers: list[int] = option([4, 8, 16], "fleet sizes (simulated workers)")
    policies: list[str] = option(
        list(MATRIX_POLICIES),
        "policies to compare ('oracle' reads the true caches; NAME:knob=value,... sets policy knobs, "
        "e.g. cache_aware:closed_loop=false)",
    )
    per_worker_concurrency: int = option(4, "requests in flight per worker (concurrency = this x workers)")
    seed: int = option(0, "workload seed (every cell of a workload sees the same requests)")
    kv_capacity_tokens: int = option(
        8192, "KV capacity per worker, tokens (below all gsp system prompts, so one worker cannot keep them all)"
    )
    page_size: int = option(16, "KV page size of the simulated workers, tokens")
    dp_size: int = option(
        1,
        "data-parallel ranks per simulated endpoint: --workers counts ranks (caches), so --workers 8 --dp-size 4"
        " is 2 endpoints of 4 ranks, routed to rank by rank",
    )
    max_running_requests: int = option(16, "max sequences running at once per worker")
    step_base_s: float = option(0.01, "simulated cost of one scheduler step, s")
    prefill_token_s: float = option(0.0001, "simulated cost per uncached prompt token, s")
    decode_seq_s: float = option(0.001, "simulated cost per decoding sequence per step, s")
    time_scale: float = option(1.0, "wall seconds per simulated second")
    run_timeout_s: float = option(90.0, "wall-time limit of one cell, s (requests not sent are reported)")
    request_timeout_s: float = option(60.0, "give up on one request after this many s")
    peers: list[str] = option([], "peer gateways to compare on gsp at --peer-workers (smg; see scripts/peers.sh)")
    peer_workers: int = option(8, "fleet size of the peer comparison")
    peer_policies: list[str] = option(["round_robin", "cache_aware"], "policies run on ours and on each peer")
    peers_python: str = option(launch.PEERS_PYTHON, "python of the peers' virtualenv")
    peers_only: bool = option(False, "run the peer comparison alone, without the matrix cells")
    peer_rounds: int = option(1, "rounds of the peer comparison; even rounds run the gateways in reverse order")
    peer_workload: str = option(
        "gsp", "workload of the peer comparison, sent as text: gsp completions, or the multi-turn chat (its "
        "options as for the chat cells)", choices=["gsp", "chat"],
    )
    stall_ratio: float = option(10.0, "a peer-comparison cell stalled: TTFT p99 over this x its p50, or requests/s "
                                "under 1/this of the best of its round")
    worker_transport: str = option(
        "grpc", "how the simulated workers are reached: SGLang's gRPC service, or its HTTP server", choices=["grpc", "http"]
    )
    gateway: str = option(
        "ours",
        "where our gateway runs for the matrix cells: in the fleet's process and event loop ('ours'), or as "
        "its own serve process ('ours-process', the deployment shape: the gateway's CPU does not slow the "
        "simulated fleet's clock); the oracle always runs in process (it reads the fleet's caches)",
        choices=["ours", "ours-process"],
    )
    json_out: str = option("", "write every cell's figures as JSON to this file", flag="--json")
    markdown: str = option("", "write the tables as Markdown to this file")


@dataclass(slots=True)
class Cell:
    """One run: a policy on a workload on a fleet, and what came out."""

    workload: str
    workers: int
    policy: str
    gateway: str  # "ours" (in process), "ours-process", or a peer's name
    summary: Any  # report.RunSummary
    sim: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    round: int = 1  # the peer comparison's round


    def to_dict(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "workers": self.workers,
            "policy": self.policy,
            "gateway": self.gateway,
            "error": self.error,
            "round": self.round,
            "summary": self.summary.to_dict() if self.summary is not None else None,
            "sim": self.sim,
        }

    def judge(self, result: Result, where: str = "") -> None:
        """Mark ``result`` invalid if this cell did not run or any of its requests failed."""
        label = " ".join(filter(None, (where, self.workload, f"{self.workers} workers", self.policy, self.gateway)))
        if self.summary is None:
            result.require(False, f"{label}: did not run ({self.error[:200]})")
        else:
            result.count_failed(label, self.summary.errors, self.summary.requests)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_options(parser.add_argument_group("matrix"), MatrixConfig)
    add_options(parser.add_argument_group("gsp workload"), GspConfig)
    add_options(parser.add_argument_group("chat workload"), ChatConfig)
    add_options(parser.add_argument_group("long-mix workload"), LongMixConfig)
    add_options(parser.add_argument_group("zipf-gsp workload (gsp's sizes)"), ZipfGspConfig)
    parser.set_defaults(
        **dataclasses.asdict(MATRIX_GSP), **dataclasses.asdict(MATRIX_CHAT), **dataclasses.asdict(MATRIX_LONG)
    )


# ---------------------------------------------------------------------------- one cell


def sim_config(config: MatrixConfig) -> Any:
    from gateway_lab.sim.config import SimConfig

    return SimConfig(
        page_size=config.page_size,
        kv_capacity_tokens=config.kv_capacity_tokens,
        max_running_requests=config.max_running_requests,
        dp_size=config.dp_size,
        step_base_s=config.step_base_s,
        prefill_token_s=config.prefill_token_s,
        decode_seq_s=config.decode_seq_s,
        time_scale=config.time_scale,
        seed=0,
    )


def _host_port(url: str) -> str:
    return url.partition("://")[2] or url


def true_cache_reader(fleet: Any) -> Any:
    """The oracle's ``cached_length``: a worker's radix cache, read exactly as it would match.

    (Capped at ``len - 1`` tokens: a worker always recomputes the last prompt token.)
    """
    caches = {_host_port(w.url): w.cache for w in fleet.workers}

    def cached_length(url: str, token_ids: Any) -> int:
        cache = caches.get(_host_port(url))
        if cache is None or len(token_ids) < 2:
            return 0
        return int(cache.peek_prefix_len(token_ids, len(token_ids) - 1))

    return cached_length


def sim_figures(stats: list[dict[str, Any]], wall_s: float, output_tokens: int) -> dict[str, Any]:
    """What the simulated GPUs did, independent of how fast this machine's CPU is.

    ``busy_s``: simulated seconds spent in scheduler steps (total, busiest worker, its
    ratio to the mean). ``sim_tok_s``: output tokens per busy second of the busiest
    worker, the throughput the fleet would reach if the gateway and the driver cost
    nothing. ``util``: mean busy / wall time; well below 1 means the workers were waiting
    on this process's CPU, so the wall-clock figures of that cell measure the CPU.
    """
    busy = [float(s.get("busy_seconds", 0.0)) for s in stats]
    prompt = sum(int(s.get("prompt_tokens", 0)) for s in stats)
    cached = sum(int(s.get("cached_tokens", 0)) for s in stats)
    mean = sum(busy) / len(busy) if busy else 0.0
    top = max(busy, default=0.0)
    return {
        "busy_s_total": round(sum(busy), 3),
        "busy_s_max": round(top, 3),
        "busy_max_over_mean": round(top / mean, 3) if mean else None,
        "sim_tok_s": round(output_tokens / top, 1) if top else None,
        "util": round(mean / wall_s, 3) if wall_s > 0 else None,
        "worker_hit_rate": cached / prompt if prompt else None,
        "evicted_tokens": sum(int(s.get("evicted_tokens", 0)) for s in stats),
    }


async def run_cell(
    workload: Any,
    workers: int,
    policy: str,
    config: MatrixConfig,
    tokenizer_dir: str,
    scratch: str,
    ideal: Any,
    *,
    gateway: str = "ours",
    on_result: Any = None,
) -> Cell:
    """A fresh in-process fleet, a gateway (``gateway``) with ``policy``, one run of ``workload``."""
    from gateway_lab.bench.driver import DriverConfig, run_workload
    from gateway_lab.bench.gc_quiet import quiet_collector
    from gateway_lab.bench.report import summarize

    driver = DriverConfig(
        concurrency=config.per_worker_concurrency * workers,
        duration_s=config.run_timeout_s,
        request_timeout_s=config.request_timeout_s,
    )
    kind = "http" if config.worker_transport == "http" else "sim"
    async with launch.fleet(kind, workers // config.dp_size, sim_config(config)) as fleet:  # type: ignore[call-overload]
        async def drive(url: str, label: str) -> Any:
            with quiet_collector():  # the fleet's and driver's process collects as a serving one (gc_quiet)
                return await run_workload(url, workload, driver, label=label, on_result=on_result)

        run = await _drive(fleet, workload, policy, config, tokenizer_dir, scratch, gateway, drive)
        stats = fleet.stats()
    run.worker_counters = {str(s["url"]): s for s in stats}
    ideal_rate = ideal(run) if callable(ideal) else ideal
    label = policy if gateway == "ours" else f"{gateway} {policy}"
    summary = summarize(run, ideal_hit_rate=ideal_rate, worker_ids=[str(s["url"]) for s in stats])
    summary = dataclasses.replace(summary, label=label)
    return Cell(workload.name, workers, policy, gateway, summary, sim_figures(stats, run.wall_s, summary.completion_tokens))


async def _drive(
    fleet: Any, workload: Any, policy: str, config: MatrixConfig, tokenizer_dir: str, scratch: str,
    gateway: str, drive: Any,
) -> Any:  # fmt: skip
    name, knobs = parse_variant(policy)
    if gateway == "ours":
        from gateway.policies.oracle import OraclePolicy
        from gateway_lab.bench.inprocess import serve_in_process

        oracle = name == "oracle"
        gw_config = launch.ours_config(fleet.urls, policy, tokenizer_dir, scratch, seed=config.seed, own_policy=not oracle)
        maker = None
        if oracle:
            reader = true_cache_reader(fleet)
            extra = {k: v for k, v in knobs.items() if k in ("hot_prefix_min_tokens", "hot_prefix_window")}
            maker = lambda role: OraclePolicy(reader, **extra)  # noqa: E731
        async with serve_in_process(gw_config, policy_maker=maker) as served:
            return await drive(served.url, policy)
    if gateway == "ours-process":
        args = ["--tokenizer-path", tokenizer_dir, "--tokenizer-cache-dir", scratch, "--log-level", "warning",
                *knob_flags(knobs)]
        async with launch.gateway("ours", fleet.urls, name, extra_args=args) as proc:
            return await drive(proc.url, policy)
    async with launch.gateway(
        gateway, fleet.urls, policy, peers_python=config.peers_python, tokenizer_dir=tokenizer_dir
    ) as peer:
        return await drive(peer.url, f"{gateway} {policy}")


# ---------------------------------------------------------------------------- the matrix


def build_workloads(config: MatrixConfig, args: argparse.Namespace, tokenizer_dir: str) -> dict[str, Any]:
    from gateway_lab.bench import workloads as wl

    vocab = wl.Vocab.from_tokenizer_dir(tokenizer_dir)
    out: dict[str, Any] = {}
    for name in config.workloads:
        if name == "gsp":
            out[name] = wl.gsp(from_namespace(GspConfig, args), vocab, config.seed)
        elif name == "chat":
            out[name] = wl.multi_turn_chat(from_namespace(ChatConfig, args), vocab, config.seed)
        elif name == "zipf-gsp":
            out[name] = wl.zipf_gsp(from_namespace(ZipfGspConfig, args), from_namespace(GspConfig, args), vocab,
                                    config.seed)
        else:
            out[name] = wl.long_context_mix(from_namespace(LongMixConfig, args), vocab, config.seed)
    return out


def ideal_of(workload: Any, page_size: int, tokenizer_dir: str) -> Any:
    """The ideal hit rate, or (chat) a function of the run: chat prompts embed the replies."""
    from gateway_lab.bench import workloads as wl

    if all(s.prompt_token_ids is not None for s in workload):
        return wl.ideal_hit_rate(workload, page_size)
    if all(s.endpoint == "chat" for s in workload):

        def from_run(run: Any) -> float | None:
            sent = sorted((r for r in run.results if r.ok), key=lambda r: r.start_s)
            if not sent:
                return None
            prompts, afters = wl.render_chat_prompts(
                [r.messages for r in sent], tokenizer_dir, replies=[r.text for r in sent],
                reply_tokens=[r.completion_tokens for r in sent],
            )
            return wl.ideal_hit_rate(prompts, page_size, cached_after=afters)

        return from_run
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))
    return wl.ideal_hit_rate(workload, page_size, tokenize=lambda s: tok.encode(s, add_special_tokens=False).ids)


async def run_matrix(
    config: MatrixConfig, args: argparse.Namespace, console: Any, tokenizer_dir: str
) -> list[Cell]:
    """Every (workload, fleet size, policy) cell, then the peer comparison; in that order."""
    workloads = build_workloads(config, args, tokenizer_dir) if not config.peers_only else {}
    plan: list[tuple[Any, int, str, str]] = [
        (workloads[w], n, p, "ours" if parse_variant(p)[0] == "oracle" else config.gateway)
        for w in config.workloads for n in config.workers for p in config.policies
    ] if not config.peers_only else []
    if config.peers:
        peer_workload = _peer_workload(config, args, tokenizer_dir)
        for rnd in range(1, config.peer_rounds + 1):
            for p in config.peer_policies:
                order = ["ours-process", *config.peers]
                plan += [(peer_workload, config.peer_workers, p, gw) for gw in (order if rnd % 2 else order[::-1])]
    ideals: dict[str, Any] = {}
    cells: list[Cell] = []
    t0 = time.monotonic()
    from gateway_lab.bench.progress import BenchProgress

    with tempfile.TemporaryDirectory(prefix="token-gateway-matrix-") as scratch, BenchProgress(
        console, cells=len(plan)
    ) as bars:
        # Warm-up, not recorded: the first chat request of the process compiles the chat
        # template, which would otherwise land in the first chat cell's TTFT.
        for workload in workloads.values():
            await run_cell(workload.head(4), config.dp_size, "round_robin", config, tokenizer_dir, scratch, None)
        console.print(f"warm-up done ({time.monotonic() - t0:.0f}s)")
        for i, (workload, n, policy, gateway) in enumerate(plan, 1):
            if workload.name not in ideals:
                ideals[workload.name] = ideal_of(workload, config.page_size, tokenizer_dir)
            start = time.monotonic()
            on_result = bars.run(f"{workload.name} x{n} {gateway} {policy}", len(workload))
            try:
                cell = await run_cell(
                    workload, n, policy, config, tokenizer_dir, scratch, ideals[workload.name], gateway=gateway,
                    on_result=on_result,
                )
            except (RuntimeError, OSError, ValueError) as exc:
                cell = Cell(workload.name, n, policy, gateway, None, error=str(exc)[:2000])
            if workload.name in PEER_WORKLOADS:
                cell.round = 1 + sum(1 for c in cells if (c.workload, c.policy, c.gateway) == (workload.name, policy, gateway))
            cells.append(cell)
            bars.cell_done()
            console.print(_progress_line(i, len(plan), cell, time.monotonic() - start, time.monotonic() - t0))
    return cells


def _peer_workload(config: MatrixConfig, args: argparse.Namespace, tokenizer_dir: str) -> Any:
    """The peer comparison's requests, as text both gateways tokenize themselves."""
    from gateway_lab.bench import workloads as wl

    vocab = wl.Vocab.from_tokenizer_dir(tokenizer_dir)
    if config.peer_workload == "chat":
        if config.worker_transport == "http":
            # The simulated HTTP workers render the chat a text relay sends them with
            # transformers, loaded at its first use: pay that here, not in the first cell.
            from gateway_lab.sim.chat_wire import chat_renderer
            from gateway_lab.sim.vocab import load_vocab

            chat_renderer(load_vocab(tokenizer_dir).path)
        chat = wl.multi_turn_chat(from_namespace(ChatConfig, args), vocab, config.seed)
        return dataclasses.replace(chat, name=PEER_WORKLOADS[1])
    text_gsp = dataclasses.replace(from_namespace(GspConfig, args), text_prompts=True)
    return dataclasses.replace(wl.gsp(text_gsp, vocab, config.seed), name=PEER_WORKLOADS[0])


def _progress_line(i: int, total: int, cell: Cell, took: float, elapsed: float) -> str:
    head = f"[{i}/{total}] {cell.workload} x{cell.workers} {cell.gateway} {cell.policy}"
    if cell.summary is None:
        return f"{head}: [red]failed[/]: {cell.error.splitlines()[0] if cell.error else ''}"
    s = cell.summary
    return (
        f"{head}: hit {100 * s.hit_rate:.1f}%, {s.output_tok_s:,.0f} tok/s, "
        f"TTFT p50 {_ms(s.ttft_p50_s)}, errors {s.errors}, not sent {s.not_sent} "
        f"({took:.0f}s, {elapsed / 60:.1f} min total)"
    )


# ---------------------------------------------------------------------------- tables


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{1000 * x:,.0f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


OURS = ("ours", "ours-process")
# The peer comparison's workloads (cells of every gateway): gsp sent as text, or the chat.
PEER_WORKLOADS = ("gsp-text", "chat-peers")
PEER_WORKLOAD = PEER_WORKLOADS[0]


def _find(cells: list[Cell], workload: str, workers: int, policy: str, gateway: str | None = None) -> Cell | None:
    """The cell of (workload, workers, policy) run on ``gateway`` (None: ours, in or out of process)."""
    for c in cells:
        if (c.workload, c.workers, c.policy) == (workload, workers, policy) and (
            c.gateway == gateway if gateway is not None else c.gateway in OURS
        ):
            return c
    return None


def workload_rows(cells: list[Cell], workload: str, workers: list[int], policies: list[str]) -> list[list[str]]:
    """One row per (fleet size, policy); ratios are against round_robin on the same fleet."""
    rows = []
    for n in workers:
        base = _find(cells, workload, n, "round_robin")
        base_s = base.summary if base and base.summary else None
        base_sim = base.sim.get("sim_tok_s") if base else None
        for p in policies:
            c = _find(cells, workload, n, p)
            if c is None:
                continue
            if c.summary is None:
                rows.append([str(n), p, "failed: " + c.error.splitlines()[0][:60], *["-"] * 7])
                continue
            s = c.summary
            sim_tps = c.sim.get("sim_tok_s")
            rows.append([
                str(n), p, f"{_pct(s.hit_rate)} ({_pct(s.ideal_hit_rate)})",
                f"{s.output_tok_s:,.0f} ({_x(s.output_tok_s, base_s.output_tok_s if base_s else None)})",
                f"{sim_tps or 0:,.0f} ({_x(sim_tps, base_sim)})",
                f"{_ms(s.ttft_p50_s)} / {_ms(s.ttft_p99_s)}",
                f"{c.sim.get('busy_s_total', 0):.1f} ({c.sim.get('busy_max_over_mean') or 0:.2f})",
                f"{c.sim.get('util') or 0:.2f}", f"{s.ok}/{s.requests + s.not_sent}",
            ])  # fmt: skip
    return rows


def _x(value: float | None, base: float | None) -> str:
    return f"{value / base:.2f}x" if value and base else "-"


WORKLOAD_HEADER = [
    "workers", "policy", "hit rate (ideal)", "output tok/s (x rr)", "sim tok/s (x rr)", "TTFT p50 / p99 ms",
    "sim busy s (max/mean)", "util", "ok",
]  # fmt: skip


def scaling_rows(cells: list[Cell], workloads: list[str], workers: list[int]) -> list[list[str]]:
    """Per workload and fleet size: what cache_aware buys over round_robin, and its gap to the oracle."""
    rows = []
    for w in workloads:
        for n in workers:
            rr, ca, orc = (_find(cells, w, n, p) for p in ("round_robin", "cache_aware", "oracle"))
            if not (rr and ca and rr.summary and ca.summary):
                continue
            r, c = rr.summary, ca.summary
            o = orc.summary if orc and orc.summary else None
            rows.append([
                w, str(n),
                f"{100 * (c.hit_rate - r.hit_rate):+.1f} pts",
                _x(c.output_tok_s, r.output_tok_s),
                _x(ca.sim.get("sim_tok_s"), rr.sim.get("sim_tok_s")),
                _x(c.ttft_p50_s, r.ttft_p50_s),
                _x(ca.sim.get("busy_s_total"), rr.sim.get("busy_s_total")),
                f"{100 * (o.hit_rate - c.hit_rate):+.1f} pts" if o else "-",
                _x(ca.sim.get("sim_tok_s"), orc.sim.get("sim_tok_s")) if o and orc else "-",
            ])  # fmt: skip
    return rows


SCALING_HEADER = [
    "workload", "workers", "hit: cache_aware - rr", "output tok/s: ca / rr", "sim tok/s: ca / rr",
    "TTFT p50: ca / rr", "sim busy: ca / rr", "hit: oracle - ca", "sim tok/s: ca / oracle",
]  # fmt: skip


def peer_rows(cells: list[Cell]) -> list[list[str]]:
    """The peer comparison; ratios are against ours (as a process) with the same policy and round."""
    rows = []
    peer_cells = [c for c in cells if c.workload in PEER_WORKLOADS]
    ref = {(c.policy, c.round): c for c in peer_cells if c.gateway == "ours-process" and c.summary}
    for c in peer_cells:
        if c.summary is None:
            rows.append([str(c.round), c.gateway, c.policy, "failed: " + c.error.splitlines()[0][:80], *["-"] * 6])
            continue
        s = c.summary
        r = ref.get((c.policy, c.round))
        rs = r.summary if r else None
        rows.append([
            str(c.round), c.gateway, c.policy, f"{_pct(s.hit_rate)} ({_pct(s.ideal_hit_rate)})",
            f"{s.req_s:,.1f} ({_x(s.req_s, rs.req_s if rs else None)})",
            f"{s.output_tok_s:,.0f} ({_x(s.output_tok_s, rs.output_tok_s if rs else None)})",
            f"{c.sim.get('sim_tok_s') or 0:,.0f} ({_x(c.sim.get('sim_tok_s'), r.sim.get('sim_tok_s') if r else None)})",
            f"{_ms(s.ttft_p50_s)} / {_ms(s.ttft_p99_s)}",
            f"{c.sim.get('util') or 0:.2f}", f"{s.ok}/{s.requests + s.not_sent}",
        ])  # fmt: skip
    return rows


PEER_HEADER = [
    "round", "gateway", "policy", "hit rate (ideal)", "requests/s (x ours)", "output tok/s (x ours)", "sim tok/s (x ours)", "TTFT p50 / p99 ms",
    "util", "ok",
]  # fmt: skip


def peer_stalls(cells: list[Cell], ratio: float) -> list[str]:
    """Per round and policy of the peer comparison, whether a gateway stalled (TTFT p99 over
    ``ratio`` x its p50, or requests/s under 1/``ratio`` of the round's best): such a round
    does not count."""
    out = []
    peer_cells = [c for c in cells if c.workload in PEER_WORKLOADS and c.summary is not None]
    for rnd, policy in dict.fromkeys((c.round, c.policy) for c in peer_cells):
        group = [c for c in peer_cells if (c.round, c.policy) == (rnd, policy)]
        best = max(c.summary.req_s for c in group)
        why = []
        for c in group:
            s = c.summary
            if s.ttft_p50_s and s.ttft_p99_s and s.ttft_p99_s > ratio * s.ttft_p50_s:
                why.append(f"{c.gateway}: TTFT p99 {_ms(s.ttft_p99_s)} ms > {ratio:g} x p50 {_ms(s.ttft_p50_s)} ms")
            if best > 0 and s.req_s * ratio < best:
                why.append(f"{c.gateway}: {s.req_s:.1f} requests/s < 1/{ratio:g} of {best:.1f}")
        order = " then ".join(c.gateway for c in group)
        out.append(f"peers round {rnd} ({order}), {policy}: " + ("STALLED: " + "; ".join(why) if why else "no stall"))
    return out


def tables(cells: list[Cell], config: MatrixConfig) -> list[Table]:
    """Every table the run prints."""
    out = []
    names = list(dict.fromkeys(c.workload for c in cells if c.gateway in OURS and c.workload not in PEER_WORKLOADS))
    for w in names:
        out.append(Table.of(f"{w}", WORKLOAD_HEADER, workload_rows(cells, w, config.workers, config.policies)))
    scaling = scaling_rows(cells, names, config.workers)
    if scaling:
        out.append(Table.of("scaling: cache_aware against round_robin and the oracle", SCALING_HEADER, scaling))
    peers = peer_rows(cells)
    if peers:
        what = "multi-turn chat" if config.peer_workload == "chat" else "gsp (text prompts)"
        out.append(Table.of(f"peers: {what}, {config.peer_workers} workers", PEER_HEADER, peers))
    return out




def run(args: argparse.Namespace) -> int:

    from gateway_lab.bench.workloads import default_tokenizer_dir

    config = from_namespace(MatrixConfig, args)
    try:
        unknown = [p for p in config.policies if parse_variant(p)[0] not in MATRIX_POLICIES]
    except ValueError as exc:
        raise SystemExit(f"bad --policies: {exc}") from exc
    if unknown or not config.policies or not config.workers or min(config.workers) < 1:
        raise SystemExit(f"bad --policies/--workers (policies from {', '.join(MATRIX_POLICIES)})")
    if config.dp_size < 1 or any(n % config.dp_size for n in config.workers):
        raise SystemExit("--workers must be multiples of --dp-size (they count ranks)")
    if config.dp_size > 1 and ("oracle" in [parse_variant(p)[0] for p in config.policies] or config.peers):
        raise SystemExit("--dp-size > 1 runs our gateway only, without the oracle (it reads one cache per endpoint)")
    oracle = not config.peers_only and "oracle" in [parse_variant(p)[0] for p in config.policies]
    if config.worker_transport == "http" and (config.dp_size > 1 or oracle):
        raise SystemExit("--worker-transport http runs without --dp-size and without the oracle")
    if config.peers_only and not config.peers:
        raise SystemExit("--peers-only needs --peers")
    if config.peers and not Path(config.peers_python).exists():
        raise SystemExit(f"{config.peers_python} not found: run scripts/peers.sh first")
    # SIGTERM unwinds like Ctrl-C, so the finally blocks stop the fleets and any peer process.
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    console = results.console(160)
    tokenizer_dir = str(default_tokenizer_dir())
    result = Result()
    try:
        cells = asyncio.run(run_matrix(config, args, console, tokenizer_dir))
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: every fleet and peer process of the run has been stopped[/]")
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    result.tables = tables(cells, config)
    result.notes += peer_stalls(cells, config.stall_ratio)
    result.data = {
        "matrix": dataclasses.asdict(config),
        "workloads": {
            "gsp": dataclasses.asdict(from_namespace(GspConfig, args)),
            "chat": dataclasses.asdict(from_namespace(ChatConfig, args)),
            "long-mix": dataclasses.asdict(from_namespace(LongMixConfig, args)),
            "zipf-gsp": dataclasses.asdict(from_namespace(ZipfGspConfig, args)),
        },
        "cells": [c.to_dict() for c in cells],
    }
    for cell in cells:
        cell.judge(result)
    return write(result, console, json_path=config.json_out, markdown_path=config.markdown)
