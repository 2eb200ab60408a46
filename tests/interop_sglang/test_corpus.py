"""The goal's corpus, in the suite: SGLang's scheduler receives the same request via the gateway
as via SGLang's own HTTP server. One run per session (``corpus_result``); the table and the
totals are printed by ``python -m tests.interop_sglang.corpus``.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.interop_sglang import corpus, servers

# The first test to use the corpus starts SGLang's HTTP server and sends 92 requests.
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="session")
def corpus_result(sglang_grpc: servers.Process, sglang_http: servers.Process,
                  gateway: servers.Process) -> dict[str, Any]:
    return corpus._run_corpus(sglang_grpc, sglang_http, gateway)


def _of_kind(result: dict[str, Any], *kinds: str) -> list[dict[str, Any]]:
    return [d for d in result["differences"] if d["kind"] in kinds]


def test_the_corpus_is_large_enough() -> None:
    assert len(corpus.CORPUS) >= 40
    assert {path for _, path, _ in corpus.CORPUS} == {"/v1/chat/completions", "/v1/completions"}


def test_every_request_is_served_on_both_paths(corpus_result: dict[str, Any]) -> None:
    failed = {name: s for name, s in corpus_result["statuses"].items() if tuple(s) != (200, 200)}
    assert failed == {}


def test_prompts_reach_the_scheduler_token_identical(corpus_result: dict[str, Any]) -> None:
    assert [d for d in corpus_result["differences"] if d["field"] in ("input_ids", "requests received")] == []


def test_every_difference_has_a_known_reason(corpus_result: dict[str, Any]) -> None:
    assert _of_kind(corpus_result, "unexplained") == []


def test_the_gateway_causes_no_difference(corpus_result: dict[str, Any]) -> None:
    """What remains is SGLang's servicer or its proto (``corpus.KINDS``), each pinned below."""
    assert [d for d in corpus_result["differences"] if d["cause"] == corpus.GATEWAY] == []
    assert corpus_result["by_cause"][corpus.GATEWAY] == 0


def test_whole_answers_reach_the_scheduler_unstreamed(corpus_result: dict[str, Any]) -> None:
    """A client that does not stream, capped or not (``chat-bare`` has no max_tokens: its budget
    is the context the prompt leaves), is asked for unstreamed, as SGLang's HTTP server asks."""
    assert _of_kind(corpus_result, "unary-stream") == []


def test_model_defaults_match(corpus_result: dict[str, Any]) -> None:
    assert _of_kind(corpus_result, "defaults") == []


def test_stops_match(corpus_result: dict[str, Any]) -> None:
    """A worker with its own tokenizer gets the stop strings and ids as the client sent them."""
    assert [d for d in corpus_result["differences"]
            if d["field"] in ("sampling.stop_strs", "sampling.stop_token_ids")] == []


@pytest.mark.xfail(strict=True, reason=corpus.KINDS["seed"].reason)
def test_seeds_match(corpus_result: dict[str, Any]) -> None:
    assert _of_kind(corpus_result, "seed") == []


@pytest.mark.xfail(strict=True, reason=corpus.KINDS["fan-out"].reason)
def test_n_reaches_the_scheduler_as_sglang_http_sends_it(corpus_result: dict[str, Any]) -> None:
    assert _of_kind(corpus_result, "fan-out") == []


def test_detokenization_options_match(corpus_result: dict[str, Any]) -> None:
    assert [d for d in corpus_result["differences"]
            if d["field"] in ("sampling.spaces_between_special_tokens", "sampling.skip_special_tokens",
                              "sampling.no_stop_trim")] == []
