"""`token-gateway bench SUB ...`: the benchmark sub-commands.

* ``run``: drive a workload through running gateways (``bench/cli.py``, also
  ``python -m gateway_lab.bench``);
* ``matrix``: every policy on every workload against simulated fleets of several
  sizes, with the oracle and optional peers (``bench/matrix.py``);
* ``trace``: a public trace (Mooncake's format, or JSONL prompts with timestamps)
  through each policy on two differently built fleets (``bench/trace_bench.py``);
* ``elastic``: workers added and removed under load, a steady run beside it
  (``bench/elastic.py``);
* ``fairness``: API keys sharing a saturated fleet through the admission queue
  (``bench/fairness.py``); ``fairness-replay``: the same runs on a virtual clock
  (``bench/fairness_replay.py``);
* one scenario each (``bench/scenarios/``): a fixed measurement on a fleet and gateway
  it starts itself, printing its figures (and JSON where it has a ``--json`` flag).

Each sub-command module exposes ``add_arguments(parser)`` and ``run(args)``, like the
top-level commands; a scenario module exposes ``add_arguments(parser)`` and
``main(args)``. Add a new one to ``SUBCOMMANDS`` or ``SCENARIOS``. Every one exits by the
same rule: its exit status is its result's (``results.write``, ``Result.exit_status``),
non-zero when the run is invalid (failed requests, a stall, a gateway that died).
"""

from __future__ import annotations

import argparse
import importlib

HELP = "benchmarks: drive running gateways (run), the policy x workload x fleet matrix"

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "run": ("gateway_lab.bench.cli", "drive a workload through running gateways and compare them"),
    "matrix": ("gateway_lab.bench.matrix", "every policy x workload x fleet size on simulated fleets (+ oracle, peers)"),
    "trace": ("gateway_lab.bench.trace_bench", "replay a public trace through each policy on two fleet builds, with its ideals"),
    "elastic": ("gateway_lab.bench.elastic", "a fleet growing and shrinking under load: time to fair share, hit rate"),
    "fairness": ("gateway_lab.bench.fairness", "API keys sharing a saturated fleet: a light key's TTFT beside a heavy one, shares by weight"),
    "fairness-replay": ("gateway_lab.bench.fairness_replay", "bench fairness's runs on a virtual clock: the gateway's admission and gate rules before the simulator's step model, the same figures on any host"),
}


# name -> (module under gateway_lab.bench.scenarios, one-line help)
SCENARIOS: dict[str, tuple[str, str]] = {
    "overhead": ("overhead", "what the gateway adds on top of its workers; gateways side by side (compare)"),
    "peer-cost": ("peer_cost", "our CPU per request against SMG's on zero-cost workers both serve without stalls"),
    "policies": ("policies", "routing policies: decision time, tree memory, eviction; pure simulation of hit rates"),
    "faults": ("faults", "what clients see when one worker of four is killed, stalls or fails"),
    "scaleout": ("scaleout", "one process, --processes 2 and synced replicas: routing and throughput"),
    "pd": ("pd", "prefill/decode disaggregation on gsp: prefill-side hit rate per prefill policy"),
    "sim": ("sim", "raw capacity of one simulated worker over loopback gRPC"),
    "peer-stall": ("peer_stall", "SMG's latency in front of zero-cost simulated workers (seconds: it waits on something)"),
    "tokenize": ("tokenize", "tokenization: encode throughput, chat-template render, multi-turn cache"),
    "control": ("control", "control plane: failover when a worker dies under load; admission cost"),
    "parsers": ("parsers", "CPU per streamed delta of every tool-call parser"),
    "front-doors": ("front_doors", "relay overhead and throughput of each front door over a zero-cost worker"),
    "tracing": ("tracing", "what tracing and per-token metrics cost: CPU per request, off and on"),
    "http-guard": ("http_guard", "CPU cost of the HTTP connection guard against plain httptools"),
    "reply-cache": ("reply_cache", "CPU cost of reply token reuse per multi-turn chat request"),
    "store": ("store", "cost of the history store per stored turn: memory, SQLite, PostgreSQL"),
    "agent-turns": ("agent_turns", "prefix-cache hit rate of multi-turn agents: previous_response_id against chat messages"),
    "latency-timeline": ("latency_timeline", "where one request's time goes at concurrency 1, stage by stage"),
    "hop-floor": ("hop_floor", "what one extra proxy hop costs with no work at all (nginx grpc_pass)"),
    "soak": ("soak", "a long run under random worker faults and client hang-ups: clean outcomes, flat memory"),
    "transports": ("transports", "gsp hit rate and gateway CPU per worker engine and transport, in one run"),
    "hostile": ("hostile", "hostile workers and chat templates against a gateway process: answers, /health latency, RSS"),
    "join-holds": ("join_holds", "CPU of each GIL-holding native call of a model joining a running gateway"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench_command", required=True, metavar="SUB")
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text, formatter_class=parser.formatter_class)
        p.set_defaults(_bench_module=module, _bench_entry="run")
        importlib.import_module(module).add_arguments(p)
    for name, (module, help_text) in SCENARIOS.items():
        scenario = importlib.import_module(f"gateway_lab.bench.scenarios.{module}")
        p = sub.add_parser(name, help=help_text, description=scenario.__doc__, formatter_class=_ScenarioHelp)
        p.set_defaults(_bench_module=scenario.__name__, _bench_entry="main")
        scenario.add_arguments(p)


class _ScenarioHelp(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """A scenario's docstring is its manual: its line breaks are kept, and defaults shown."""


def run(args: argparse.Namespace) -> int:
    module = importlib.import_module(args._bench_module)
    return int(getattr(module, args._bench_entry)(args) or 0)
