"""The corpus: what vLLM's engine core receives through the gateway vs from vLLM's own server.

Each OpenAI request of ``CORPUS`` (the SGLang suite's: chat and completions, sampling
fields set, omitted and at their edges, stops, n, seeds, logprobs, prompt logprobs; and
constrained decoding as vLLM names it) is sent (a) through the gateway in front of vLLM's OpenAI server, (b) through
the gateway in front of vLLM's ``--grpc`` servicer and (c) straight to vLLM's own OpenAI
server, and the ``EngineCoreRequest``s the stand-in core received are compared field by
field (``standin.core._describe``): prompt ids, sampling values, limits, stops, logprob
options, the constraint. Every difference is classified in ``KINDS``; anything else is
"unexplained" and the gateway's until shown otherwise.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gateway.protocol.common import choice_regex
from gateway.protocol.sampling import JSON_OBJECT_SCHEMA
from tests.interop_sglang import corpus as sglang_corpus
from tests.interop_sglang.corpus import _chat, _collect, _comp, _same
from tests.interop_sglang.servers import Process

SCHEMA = {"type": "object", "properties": {"river": {"type": "string"}}, "required": ["river"]}

# EngineCoreRequest.sampling_params fields compared (``_describe`` records them).
SAMPLING_FIELDS = (
    "n", "temperature", "top_p", "top_k", "min_p", "seed", "max_tokens", "min_tokens",
    "stop_token_ids", "ignore_eos", "logprobs", "prompt_logprobs", "presence_penalty",
    "frequency_penalty", "repetition_penalty", "skip_special_tokens",
    "spaces_between_special_tokens", "stop", "include_stop_str_in_output", "logit_bias",
    "allowed_token_ids", "bad_words", "structured_outputs", "output_kind",
)

# The SGLang suite's corpus, then what vLLM's requests add: its constraint field.
CORPUS: list[tuple[str, str, dict[str, Any]]] = [
    *sglang_corpus.CORPUS,
    _chat("chat-json_schema", response_format={"type": "json_schema",
                                               "json_schema": {"name": "r", "schema": SCHEMA}}, max_tokens=8),
    _chat("chat-structured-regex", structured_outputs={"regex": "[A-Z][a-z]+"}, max_tokens=8),
    _chat("chat-structured-json", structured_outputs={"json": SCHEMA}, max_tokens=8),
    _comp("comp-structured-regex", structured_outputs={"regex": "[0-9]+"}, max_tokens=6),
    _comp("comp-structured-choice", structured_outputs={"choice": ["Paris", "Lyon"]}, max_tokens=6),
    _comp("comp-structured-grammar", structured_outputs={"grammar": 'root ::= "yes" | "no"'}, max_tokens=6),
]


@dataclass(frozen=True)
class Kind:
    """Why a field differs: whose doing it is (``gateway``, ``upstream``: vLLM's servicer or
    server, which the gateway cannot change, or ``choice``: a documented gateway rule)."""

    cause: str
    reason: str


GATEWAY, UPSTREAM, CHOICE = "gateway", "upstream", "choice"

KINDS: dict[str, Kind] = {
    "defaults": Kind(CHOICE, "a legacy completion that leaves out temperature / top_p / top_k gets OpenAI's "
                             "values (1.0 / 1.0 / off); vLLM's own /v1/completions applies the model's "
                             "generation_config.json (0.6 / 0.95 / 20). The gateway follows SGLang's "
                             "/v1/completions there (docs/sglang-mapping.md); chat gets the model's on every path"),
    "stops": Kind(CHOICE, "stop strings are the gateway's on every engine: none are sent, a one-token stop "
                          "string goes as a stop id, and a whole answer with stop strings is streamed from the "
                          "worker (output_kind DELTA, not FINAL_ONLY) so the gateway ends it at the match"),
    "schema-text": Kind(CHOICE, "the same JSON schema, sent as its text (the seam carries a constraint as text); "
                                "vLLM takes both forms"),
    "choice-regex": Kind(CHOICE, "structured_outputs.choice goes as the regex of its escaped alternatives (the "
                                 "seam has no choice constraint; a regex is what every grammar backend takes); "
                                 "vLLM's own frontend makes it an EBNF grammar; the same strings match"),
    "json-object": Kind(CHOICE, "json_object goes as the schema {\"type\": \"object\"} (SGLang's reading, "
                                "and OpenAI's: a JSON object); vLLM's own json_object grammar also admits arrays"),
    "unexplained": Kind(GATEWAY, "no known reason: a new disagreement, the gateway's until shown otherwise"),
}


@dataclass
class Difference:
    request: str
    transport: str
    field: str
    via_gateway: Any
    via_vllm: Any
    kind: str = "unexplained"


def _norm(name: str, value: Any) -> Any:
    if name in ("stop", "stop_token_ids", "bad_words", "allowed_token_ids"):
        return sorted(value or [])
    if name == "logit_bias":
        return {str(k): float(v) for k, v in (value or {}).items()}
    return value


def compare(name: str, transport: str, gw: list[dict[str, Any]], own: list[dict[str, Any]]) -> list[Difference]:
    """The fields in which the core's requests via the gateway differ from vLLM's own."""
    if len(gw) != len(own):
        return [Difference(name, transport, "requests received", len(gw), len(own))]
    diffs: list[Difference] = []
    key = lambda r: (r["sampling"].get("seed") is None, r["sampling"].get("seed") or 0)  # noqa: E731
    for a, b in zip(sorted(gw, key=key), sorted(own, key=key), strict=True):
        if a["prompt_token_ids"] != b["prompt_token_ids"]:
            diffs.append(Difference(name, transport, "prompt_token_ids", len(a["prompt_token_ids"]),
                                    len(b["prompt_token_ids"])))
        for f in SAMPLING_FIELDS:
            va, vb = _norm(f, a["sampling"].get(f)), _norm(f, b["sampling"].get(f))
            if not _same(va, vb):
                diffs.append(Difference(name, transport, f"sampling.{f}", va, vb))
    return diffs


def run(model: str, gateways: dict[str, Process], own: Process) -> dict[str, Any]:
    """Send the corpus through each of ``gateways`` (by transport) and to ``own`` (vLLM's
    OpenAI server); the differences, classified, and the statuses."""
    diffs: list[Difference] = []
    statuses: dict[str, dict[str, int]] = {}
    for name, path, body in CORPUS:
        body = {"model": model, **body}
        status, via_own = _collect(own.extra["recording"], own.extra["url"], path, body)
        statuses[name] = {"vllm": status}
        for transport, gateway in gateways.items():
            worker = gateway.extra["worker"]
            s_gw, via_gw = _collect(worker.extra["recording"], gateway.extra["url"], path, body)
            statuses[name][transport] = s_gw
            found = compare(name, transport, via_gw, via_own)
            if s_gw != status:
                found.append(Difference(name, transport, "HTTP status", s_gw, status))
            for d in found:
                d.kind = classify(body, d)
            diffs.extend(found)
    by_kind: dict[str, int] = {}
    for d in diffs:
        by_kind[d.kind] = by_kind.get(d.kind, 0) + 1
    return {"requests": len(CORPUS), "differences": [{**d.__dict__, "cause": KINDS[d.kind].cause} for d in diffs],
            "statuses": statuses, "by_kind": by_kind}


def classify(body: dict[str, Any], d: Difference) -> str:
    """The known reason for ``d``, checked against the request (a value the client set must
    arrive as sent), or "unexplained"."""
    field = d.field.removeprefix("sampling.")
    is_chat = "messages" in body
    if field in ("temperature", "top_p", "top_k") and not is_chat and field not in body:
        return "defaults"
    if field in ("stop", "stop_token_ids") and body.get("stop"):
        return "stops"
    if field == "output_kind" and body.get("stop") and not body.get("stream"):
        return "stops"
    if field == "structured_outputs":
        mine, theirs = d.via_gateway or {}, d.via_vllm or {}
        if isinstance(theirs.get("json"), dict) and json.loads(mine.get("json", "null")) == theirs["json"]:
            return "schema-text"
        choice = (body.get("structured_outputs") or {}).get("choice")
        if choice and mine == {"regex": choice_regex(choice)}:  # vLLM's frontend makes it a grammar
            return "choice-regex"
        if theirs == {"json_object": True} and mine == {"json": JSON_OBJECT_SCHEMA}:
            return "json-object"
    return "unexplained"


def table(result: dict[str, Any]) -> str:
    """The differences as a Markdown table, then the count by kind."""
    lines = ["| request | transport | field | via gateway | via vLLM | kind |", "| --- | --- | --- | --- | --- | --- |"]
    for d in result["differences"]:
        lines.append(f"| {d['request']} | {d['transport']} | {d['field']} | {d['via_gateway']} | {d['via_vllm']} "
                     f"| {d['kind']} |")
    lines.append("")
    lines.append(f"requests: {result['requests']}, differences: {len(result['differences'])}, by kind: "
                 f"{result['by_kind']}")
    return "\n".join(lines)
