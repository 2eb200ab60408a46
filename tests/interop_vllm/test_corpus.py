"""The corpus (``corpus.py``): vLLM's engine core receives the same request through the
gateway, on either transport, as from vLLM's own OpenAI server, but for the differences
whose reason is known. One run per session; ``-s`` prints the table."""

from __future__ import annotations

from typing import Any

import pytest

from tests.interop_sglang.servers import Process
from tests.interop_vllm import corpus

pytestmark = pytest.mark.timeout(1200)


@pytest.fixture(scope="session")
def corpus_result(
    gateway_http: Process, gateway_grpc: Process, vllm_http: Process, model: str
) -> dict[str, Any]:
    result = corpus.run(model, {"http": gateway_http, "grpc": gateway_grpc}, vllm_http)
    print("\n" + corpus.table(result))
    return result


def test_the_corpus_covers_both_apis_and_constraints() -> None:
    assert len(corpus.CORPUS) >= 45
    assert {path for _, path, _ in corpus.CORPUS} == {"/v1/chat/completions", "/v1/completions"}
    assert sum("structured_outputs" in body for _, _, body in corpus.CORPUS) >= 5


def test_every_request_is_served_on_every_path(corpus_result: dict[str, Any]) -> None:
    failed = {n: s for n, s in corpus_result["statuses"].items() if set(s.values()) != {200}}
    assert failed == {}


def test_prompts_reach_the_core_token_identical(corpus_result: dict[str, Any]) -> None:
    assert [d for d in corpus_result["differences"]
            if d["field"] in ("prompt_token_ids", "requests received")] == []


def test_every_difference_has_a_known_reason(corpus_result: dict[str, Any]) -> None:
    assert [d for d in corpus_result["differences"] if d["kind"] == "unexplained"] == []


def test_the_gateway_causes_no_difference(corpus_result: dict[str, Any]) -> None:
    """What remains is a documented rule of the gateway (``corpus.KINDS``), never an accident."""
    assert [d for d in corpus_result["differences"] if d["cause"] == corpus.GATEWAY] == []


def test_both_transports_reach_the_core_alike(corpus_result: dict[str, Any]) -> None:
    """Over vLLM's OpenAI server and over its gRPC servicer the core gets the same request,
    but for top_k "off" (-1 over HTTP, 0 over gRPC: vLLM reads both as all tokens)."""
    def seen(transport: str) -> set[tuple[str, str, str]]:
        return {(d["request"], d["field"], str(d["via_gateway"])) for d in corpus_result["differences"]
                if d["transport"] == transport}

    def top_k_off(found: set[tuple[str, str, str]]) -> set[tuple[str, str, str]]:
        return {(r, f, "off" if (f, v) in (("sampling.top_k", "-1"), ("sampling.top_k", "0")) else v)
                for r, f, v in found}

    assert top_k_off(seen("http")) == top_k_off(seen("grpc"))


def test_vllms_structured_outputs_reach_the_core_as_the_same_constraint(corpus_result: dict[str, Any]) -> None:
    names = {name for name, _, body in corpus.CORPUS if "structured_outputs" in body}
    odd = [d for d in corpus_result["differences"] if d["request"] in names and d["field"] == "sampling.structured_outputs"
           and d["kind"] not in ("schema-text", "choice-regex")]
    assert odd == []
