"""Benchmarks: what a routing policy is worth, measured through the gateway's front door.

* ``workloads``: seeded request generators (gsp, multi-turn chat, long-context mix),
  JSONL traces, and the ideal hit rate of a workload;
* ``driver``: replays a workload over OpenAI HTTP with bounded concurrency or timed
  arrivals, timing each streamed request;
* ``report`` / ``plot``: the figures of a run and policies side by side;
* ``serve_process``: ``token-gateway serve`` as a child process, cleaned up on any exit;
* ``cli`` (``python -m gateway_lab.bench``, ``token-gateway bench run``): drive running
  gateways. ``gateway_lab.demo`` runs the whole thing against simulated fleets it starts itself;
* ``matrix`` (``token-gateway bench matrix``): every policy x workload x fleet size, with
  the evaluation-only oracle (``policies.oracle``) and peers (``peers``: smg from PyPI);
  ``inprocess`` serves the gateway from the benchmark's own process for it;
* ``commands``: the ``bench`` sub-commands.
"""
