"""The corpus: what SGLang's scheduler receives through the gateway vs SGLang's own HTTP server.

For each OpenAI request of ``CORPUS`` (chat and completions; sampling fields set,
omitted and at their edges; stops, n, seeds, logprobs, max_tokens) this sends it
(a) through ``token-gateway serve`` to SGLang's ``--grpc-mode`` servicer and
(b) to SGLang's own OpenAI HTTP server, both in front of the stand-in scheduler,
and compares the ``TokenizedGenerateReqInput`` each scheduler received: sampling
values, limits, stops, logprob options and input ids. It prints one row per
difference and the totals.

    .venv/bin/python -m tests.interop_sglang.corpus [--json OUT]

(``scripts/run-interop-sglang --corpus`` builds the environment first.)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.interop_sglang import servers

SYSTEM = {"role": "system", "content": "You are a terse assistant."}
USER = {"role": "user", "content": "Name three rivers in Europe."}
LONG_USER = {"role": "user", "content": "Summarise the plot of a long novel. " * 40}

# Fields of SamplingParams compared (the rest are internal or derived).
SAMPLING_FIELDS = (
    "temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty",
    "repetition_penalty", "max_new_tokens", "min_new_tokens", "n", "stop_strs", "stop_token_ids",
    "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim",
    "sampling_seed", "logit_bias", "json_schema", "regex", "ebnf", "stream_interval",
)
REQUEST_FIELDS = ("input_ids", "stream", "return_logprob", "top_logprobs_num", "logprob_start_len", "token_ids_logprob")


def _chat(name: str, **body: Any) -> tuple[str, str, dict[str, Any]]:
    body.setdefault("messages", [USER])
    return name, "/v1/chat/completions", body


def _comp(name: str, **body: Any) -> tuple[str, str, dict[str, Any]]:
    body.setdefault("prompt", "The capital of France is")
    return name, "/v1/completions", body


CORPUS: list[tuple[str, str, dict[str, Any]]] = [
    _chat("chat-bare"),
    _chat("chat-max_tokens", max_tokens=16),
    _chat("chat-max_completion_tokens", max_completion_tokens=12),
    _chat("chat-temperature-0", temperature=0, max_tokens=8),
    _chat("chat-temperature-0.7", temperature=0.7, max_tokens=8),
    _chat("chat-temperature-2", temperature=2.0, max_tokens=8),
    _chat("chat-top_p", top_p=0.5, max_tokens=8),
    _chat("chat-top_k", top_k=5, max_tokens=8),
    _chat("chat-min_p", min_p=0.1, max_tokens=8),
    _chat("chat-all-sampling", temperature=0.8, top_p=0.9, top_k=40, min_p=0.02, max_tokens=8),
    _chat("chat-presence", presence_penalty=0.6, max_tokens=8),
    _chat("chat-frequency", frequency_penalty=-0.5, max_tokens=8),
    _chat("chat-repetition", repetition_penalty=1.2, max_tokens=8),
    _chat("chat-seed", seed=42, max_tokens=8),
    _chat("chat-seed-temp", seed=7, temperature=0.9, max_tokens=8),
    _chat("chat-stop-str", stop=["\n\n"], max_tokens=8),
    _chat("chat-stop-list", stop=["Paris", "Rhine", "."], max_tokens=8),
    _chat("chat-stop-ids", stop_token_ids=[1000, 2000], max_tokens=8),
    _chat("chat-n2", n=2, max_tokens=6),
    _chat("chat-n3-seed", n=3, seed=5, max_tokens=6),
    _chat("chat-logprobs", logprobs=True, max_tokens=6),
    _chat("chat-top_logprobs", logprobs=True, top_logprobs=3, max_tokens=6),
    _chat("chat-stream", stream=True, max_tokens=6),
    _chat("chat-stream-usage", stream=True, stream_options={"include_usage": True}, max_tokens=6),
    _chat("chat-system", messages=[SYSTEM, USER], max_tokens=6),
    _chat("chat-multiturn", messages=[USER, {"role": "assistant", "content": "Rhine, Danube, Seine."},
                                     {"role": "user", "content": "Two more."}], max_tokens=6),
    _chat("chat-long", messages=[LONG_USER], max_tokens=6),
    _chat("chat-min_tokens", min_tokens=3, max_tokens=8),
    _chat("chat-ignore_eos", ignore_eos=True, max_tokens=8),
    _chat("chat-skip_special_false", skip_special_tokens=False, max_tokens=8),
    _chat("chat-logit_bias", logit_bias={"1000": 5.0}, max_tokens=8),
    _chat("chat-json", response_format={"type": "json_object"}, max_tokens=8),
    _comp("comp-bare"),
    _comp("comp-max_tokens", max_tokens=16),
    _comp("comp-temperature-0", temperature=0, max_tokens=8),
    _comp("comp-sampling", temperature=0.5, top_p=0.7, top_k=10, max_tokens=8),
    _comp("comp-penalties", presence_penalty=0.3, frequency_penalty=0.4, max_tokens=8),
    _comp("comp-seed", seed=1234, max_tokens=8),
    _comp("comp-stop", stop=["."], max_tokens=8),
    _comp("comp-stop-ids", stop_token_ids=[1234], max_tokens=8),
    _comp("comp-n2", n=2, max_tokens=6),
    _comp("comp-logprobs", logprobs=2, max_tokens=6),
    _comp("comp-echo-logprobs", logprobs=1, echo=True, max_tokens=4),
    _comp("comp-stream", stream=True, max_tokens=6),
    _comp("comp-token-ids", prompt=[785, 6722, 315, 9625, 374], max_tokens=6),
    _comp("comp-min_tokens", min_tokens=2, max_tokens=6),
]


@dataclass
class Difference:
    request: str
    field: str
    via_gateway: Any
    via_sglang_http: Any
    kind: str = ""


@dataclass(frozen=True)
class Kind:
    """Why a field differs: whose doing it is (``gateway``, or ``upstream``: SGLang's
    ``--grpc-mode`` servicer or its proto, which the gateway cannot change) and how."""

    cause: str
    reason: str


GATEWAY, UPSTREAM = "gateway", "upstream (servicer/proto)"

# Why a field differs, where the reason is known. Anything else is "unexplained", and the
# gateway's until shown otherwise.
KINDS: dict[str, Kind] = {
    "defaults": Kind(GATEWAY, "the model's generation defaults were not applied (SGLang's HTTP server "
                              "applies them to chat, not to completions)"),
    "unary-stream": Kind(GATEWAY, "a whole answer the client did not stream reached the worker streamed in "
                                  "chunks (SGLang's frontends ask for it unstreamed)"),
    "seed": Kind(UPSTREAM, "smg-grpc-proto 0.4.28's SamplingParams has no seed field "
                           "(sglang_scheduler.proto lines 75-110) and smg-grpc-servicer 0.14.1's "
                           "_convert_sampling_params never sets sampling_seed (servicer.py lines 1129-1153); "
                           "SGLang's HTTP server sets it from seed (entrypoints/openai/protocol.py line 1233)"),
    "fan-out": Kind(UPSTREAM, "smg-grpc-servicer 0.14.1 sets n=1 on the prefix request and on each of the n "
                              "samples it sends the scheduler (request_manager.py lines 342 and 362); SGLang's "
                              "HTTP server keeps n=N on them (managers/tokenizer_manager.py lines 2145-2180). "
                              "The gateway sends n=N once, as the proto asks; no request it can send reaches "
                              "the scheduler with n=N. Same number of scheduler requests, same samples"),
    "unexplained": Kind(GATEWAY, "no known reason: a new disagreement, the gateway's until shown otherwise"),
}
_FIELD_KIND = {
    "sampling.temperature": "defaults", "sampling.top_p": "defaults", "sampling.top_k": "defaults",
    "sampling.sampling_seed": "seed",
    "sampling.stream_interval": "unary-stream", "stream": "unary-stream", "sampling.n": "fan-out",
}


def classify(name: str, body: dict[str, Any], d: Difference) -> str:
    kind = _FIELD_KIND.get(d.field, "unexplained")
    if kind == "defaults" and d.field.removeprefix("sampling.") in body:
        return "unexplained"  # a value the client set must arrive as sent
    if kind == "seed" and "seed" not in body:
        return "unexplained"
    if kind == "unary-stream" and (body.get("stream") or d.via_sglang_http not in (None, False)):
        return "unexplained"
    if kind == "fan-out" and body.get("n", 1) == 1:
        return "unexplained"
    return kind


def cause(kind: str) -> str:
    return KINDS.get(kind, KINDS["unexplained"]).cause


def _norm(name: str, value: Any) -> Any:
    if name in ("stop_strs", "stop_token_ids"):
        return sorted(value or [])
    if name == "logit_bias":
        return {str(k): float(v) for k, v in (value or {}).items()}
    return value


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None:
            return a is b
        return math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-7)
    return bool(a == b)


def compare(name: str, gw: list[dict[str, Any]], http: list[dict[str, Any]]) -> list[Difference]:
    diffs: list[Difference] = []
    if len(gw) != len(http):
        diffs.append(Difference(name, "requests received", len(gw), len(http)))
    if not gw or not http:
        return diffs
    a, b = gw[0], http[0]
    for f in REQUEST_FIELDS:
        va, vb = a.get(f), b.get(f)
        if f == "logprob_start_len" and not (a.get("return_logprob") or b.get("return_logprob")):
            continue
        if f == "input_ids" and va != vb:
            diffs.append(Difference(name, f, f"{len(va)} ids", f"{len(vb)} ids (first diff at "
                                    f"{next((i for i, (x, y) in enumerate(zip(va, vb, strict=False)) if x != y), min(len(va), len(vb)))})"))
        elif not _same(va, vb):
            diffs.append(Difference(name, f, va, vb))
    for f in SAMPLING_FIELDS:
        va, vb = _norm(f, a["sampling_params"].get(f)), _norm(f, b["sampling_params"].get(f))
        if not _same(va, vb):
            diffs.append(Difference(name, f"sampling.{f}", va, vb))
    return diffs


def _send(base: str, path: str, body: dict[str, Any]) -> int:
    with httpx.Client(timeout=60) as c:
        if body.get("stream"):
            with c.stream("POST", base + path, json=body) as r:
                for _ in r.iter_lines():
                    pass
                return r.status_code
        return c.post(base + path, json=body).status_code


def _collect(rec: servers.Recording, base: str, path: str, body: dict[str, Any]) -> tuple[int, list[dict[str, Any]]]:
    rec.mark()
    status = _send(base, path, body)
    time.sleep(0.05)
    return status, rec.generates()


def run(workdir: Path) -> dict[str, Any]:
    grpc = servers.start_sglang(workdir, grpc=True)
    try:
        http = servers.start_sglang(workdir, grpc=False)
        try:
            gw = servers.start_gateway(workdir, grpc.extra["url"])
            try:
                return _run_corpus(grpc, http, gw)
            finally:
                gw.stop()
        finally:
            http.stop()
    finally:
        grpc.stop()


def _run_corpus(grpc: servers.Process, http: servers.Process, gw: servers.Process) -> dict[str, Any]:
    diffs: list[Difference] = []
    statuses: dict[str, tuple[int, int]] = {}
    for name, path, body in CORPUS:
        body = {"model": servers.SERVED_MODEL, **body}
        s_gw, via_gw = _collect(grpc.extra["recording"], gw.extra["url"], path, body)
        s_http, via_http = _collect(http.extra["recording"], http.extra["url"], path, body)
        statuses[name] = (s_gw, s_http)
        found = compare(name, via_gw, via_http)
        if s_gw != s_http:
            found.append(Difference(name, "HTTP status", s_gw, s_http))
        for d in found:
            d.kind = classify(name, body, d)
        diffs.extend(found)
    by_kind: dict[str, int] = {}
    by_cause: dict[str, int] = {GATEWAY: 0, UPSTREAM: 0}
    for d in diffs:
        by_kind[d.kind] = by_kind.get(d.kind, 0) + 1
        by_cause[cause(d.kind)] += 1
    return {"requests": len(CORPUS), "differences": [{**d.__dict__, "cause": cause(d.kind)} for d in diffs],
            "requests_with_differences": len({d.request for d in diffs}), "statuses": statuses,
            "by_kind": by_kind, "by_cause": by_cause,
            "requests_by_cause": {c: len({d.request for d in diffs if cause(d.kind) == c}) for c in by_cause}}


def print_table(result: dict[str, Any]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # plain text where rich is missing
        for d in result["differences"]:
            print(f"{d['request']:28} {d['field']:34} {d['via_gateway']!s:24} {d['via_sglang_http']!s:24} "
                  f"{d['kind']:12} {d['cause']}")
    else:
        table = Table(title="TokenizedGenerateReqInput: via the gateway vs via SGLang's own HTTP server")
        for col in ("request", "field", "via gateway", "via SGLang HTTP", "why", "caused by"):
            table.add_column(col)
        for d in result["differences"]:
            table.add_row(d["request"], d["field"], str(d["via_gateway"]), str(d["via_sglang_http"]), d["kind"],
                          d["cause"])
        Console(width=170).print(table)
    by_field: dict[str, int] = {}
    for d in result["differences"]:
        by_field[d["field"]] = by_field.get(d["field"], 0) + 1
    print(f"requests: {result['requests']}, with differences: {result['requests_with_differences']}, "
          f"differences: {len(result['differences'])}")
    for f, n in sorted(by_field.items(), key=lambda kv: -kv[1]):
        print(f"  {f}: {n}")
    print("by cause:")
    for c, n in result["by_cause"].items():
        print(f"  {n} differences (in {result['requests_by_cause'][c]} requests) the {c} causes"
              if c == GATEWAY else f"  {n} differences (in {result['requests_by_cause'][c]} requests) caused {c}")
    print("by reason:")
    for kind, n in sorted(result["by_kind"].items(), key=lambda kv: -kv[1]):
        k = KINDS.get(kind, KINDS["unexplained"])
        print(f"  {kind} ({n}, {k.cause}): {k.reason}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", type=Path, default=None, help="write the result here as JSON")
    p.add_argument("--workdir", type=Path, default=None, help="logs and recordings (default: a temp dir)")
    args = p.parse_args(argv)
    reason = servers.unavailable_reason()
    if reason:
        print(f"interop-sglang: unavailable: {reason}")
        return 3
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="interop-corpus-"))
    workdir.mkdir(parents=True, exist_ok=True)
    result = run(workdir)
    print_table(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
