"""Readable ``rich`` tables for an inspection answer (the ``Inspection.to_dict`` shape).

One renderer for both modes: the offline CLI and ``--gateway`` hand it the same
dictionary, so what a user reads does not depend on where the answer came from.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def _clip(rows: list[Any], limit: int) -> tuple[list[Any], int]:
    if limit <= 0 or len(rows) <= limit:
        return rows, 0
    return rows[:limit], len(rows) - limit


def _summary(answer: dict[str, Any]) -> Table:
    t = Table(title="prompt", show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    decision = answer.get("decision") or {}
    rows: list[tuple[str, Any]] = [
        ("model", answer.get("model") or "-"),
        ("source", answer.get("source")),
        ("pool", answer.get("pool")),
        ("tokens", answer.get("token_count")),
        ("block size", answer.get("block_size")),
        ("full blocks", len(answer.get("blocks") or [])),
        ("policy", answer.get("policy") or "-"),
    ]
    if decision.get("choice"):
        rows.append(("choice", f"{decision['choice']} ({decision.get('reason')})"))
    elif decision.get("error"):
        rows.append(("choice", f"none: {decision['error']}"))
    if answer.get("tree"):
        rows.append(("tree match", f"{answer.get('tree_match_tokens')} tokens found in the radix tree"))
    for k, v in rows:
        t.add_row(k, str(v))
    return t


def _ring(ring: dict[str, Any]) -> Table:
    t = Table(title="prefix_hash ring", show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    t.add_row("key", f"{ring['key_hex']} (first {ring['depth_tokens']} tokens, blocks of {ring['block_size']})")
    t.add_row("position", f"{ring['fraction']:.6f} of the ring, virtual node #{ring['vnode_index']} at {ring['vnode_point']:016x}")
    t.add_row("owner", f"[bold green]{ring['owner']}[/]")
    t.add_row("then", " -> ".join(ring["order"][1:]) or "-")
    t.add_row("virtual nodes", f"{ring['virtual_nodes']} per worker")
    return t


def _workers(answer: dict[str, Any]) -> Table:
    decision = answer.get("decision") or {}
    costs = decision.get("workers") or {}
    choice = decision.get("choice")
    t = Table(title="per worker: what the radix tree predicts is cached", title_justify="left")
    for col in ("worker", "available", "page", "predicted cached", "raw match", "tree tokens", "budget", "in flight", "cost"):
        if col == "worker":  # a worker's address is its name: never cut it to "127.0…"
            t.add_column(col, justify="left", no_wrap=True, min_width=max(6, *(len(w["worker_id"]) + 2 for w in answer.get("workers") or [{"worker_id": ""}])))
        else:
            t.add_column(col, justify="right")
    for w in answer.get("workers") or []:
        extra = costs.get(w["worker_id"], {})
        name = w["worker_id"] + (" *" if w["worker_id"] == choice else "")
        cost = extra.get("cost")
        t.add_row(
            name,
            "yes" if w["available"] else "no",
            str(w["page_size"]),
            str(w["predicted_cached_tokens"]),
            str(w["raw_match_tokens"]),
            str(w["tree_tokens"]),
            str(w["tree_budget"]),
            str(extra.get("in_flight", "-")),
            f"{cost:.0f}" if isinstance(cost, int | float) else "-",
        )
    return t


def _quality(q: dict[str, Any]) -> Table:
    t = Table(title="routing quality of this pool (live, since the gateway started)", show_header=False,
              title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    t.add_row("ideal hit rate", f"{100 * q.get('ideal_hit_rate', 0):.1f}% of {q.get('offered_prompt_tokens', 0):,} "
              f"prompt tokens offered (bounded prefix sketch, {q.get('sketch_tokens', 0):,} tokens)")
    t.add_row("achieved", f"{100 * q.get('achieved_hit_rate', 0):.1f}% reported cached by the workers "
              f"({q.get('finished', 0):,} streams)")
    t.add_row("predicted", f"{100 * q.get('predicted_hit_rate', 0):.1f}% expected by the policy")
    if "under_predicted" in q:
        t.add_row("closed loop", f"{q['under_predicted']:,} finishes below the prediction "
                  f"({q['corrected_tokens']:,} tree tokens cut), {q['over_predicted']:,} above "
                  f"({q['learned_tokens']:,} learned), {q['worker_resets']} worker resets")
    if "queued_prefill_weight" in q:
        load = q.get("hottest_prefix_load")
        t.add_row("queue weight", f"{q['queued_prefill_weight']:g} x queued prefill (hottest prefix: "
                  + ("too few requests seen" if load is None else f"{load:.2f} workers' share")
                  + (f"; {100 * q['cold_share']:.0f}% of requests on prefixes that are not hot" if "cold_share" in q else "")
                  + ")")
    if "decode_fill" in q:
        t.add_row("decode fill", f"{q['decode_fill']:g} x running requests' max_tokens counted as decode owed")
    for hp in q.get("hot_prefixes") or []:
        t.add_row("hot prefix", f"{hp['key']}: {100 * hp['share']:.0f}% of requests, {hp['replicas']} replicas "
                  f"on {', '.join(hp['holders'][: hp['replicas']]) or '-'}")
    causes = {k: v for k, v in (q.get("miss_causes") or {}).items() if not k.startswith("_") and v.get("tokens")}
    if causes:
        total = sum(v["tokens"] for v in causes.values()) or 1
        t.add_row("misses by cause", "; ".join(
            f"{cause} {v['tokens']:,} tokens ({100 * v['tokens'] / total:.0f}%, {v['requests']:,} requests)"
            for cause, v in sorted(causes.items(), key=lambda kv: -kv[1]["tokens"])
        ))
    guard = "load only (workers' prompt_tokens disagree)" if q.get("load_only") else "agree"
    t.add_row("tokenizer", f"{guard}; {q.get('tokenizer_mismatches', 0):,} mismatches")
    return t


def render(answer: dict[str, Any], *, rows: int = 32, console: Console | None = None) -> None:
    """Print the answer as tables; token and block tables show at most ``rows`` rows (0: all)."""
    con = console or Console()
    con.print(_summary(answer))
    tokens, more = _clip(answer.get("tokens") or [], rows)
    if tokens:
        t = Table(title="tokens", title_justify="left")
        for col in ("#", "id", "piece"):
            t.add_column(col, justify="right" if col != "piece" else "left")
        for tok in tokens:
            t.add_row(str(tok["index"]), str(tok["id"]), repr(tok["piece"]) if tok["piece"] is not None else "?")
        con.print(t)
        if more:
            con.print(f"  ... {more} more tokens (--rows 0 shows all)")
    blocks, more = _clip(answer.get("blocks") or [], rows)
    if blocks:
        t = Table(title="chained block hashes (each covers every token before its end)", title_justify="left")
        for col in ("block", "tokens", "xxh3"):
            t.add_column(col, justify="right" if col != "xxh3" else "left")
        for b in blocks:
            t.add_row(str(b["index"]), f"[{b['start']}, {b['end']})", b["hex"])
        con.print(t)
        if more:
            con.print(f"  ... {more} more blocks (--rows 0 shows all)")
    if answer.get("ring"):
        con.print(_ring(answer["ring"]))
    if answer.get("workers"):
        con.print(_workers(answer))
    if answer.get("quality"):
        con.print(_quality(answer["quality"]))
    for note in answer.get("notes") or []:
        con.print(f"[dim]note: {note}[/]")
