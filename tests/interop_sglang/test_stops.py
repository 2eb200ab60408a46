"""Stops through the gateway end answers exactly where SGLang's own HTTP server ends them.

Same request, same stand-in scheduler (SGLang's own ``Req`` decides when a request is
finished), two frontends: the gateway in front of the ``--grpc-mode`` servicer, and
SGLang's OpenAI HTTP server. For stop strings (one across a token boundary, two that
complete in the same token, a one-token one, with and without ``no_stop_trim``), stop
token ids and the model's own EOS, chat and completions, whole and streamed: the text,
the finish reason, the matched stop and the completion-token count must be equal.

The stop strings are cut from the stand-in model's known output, so they do occur.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.interop_sglang import expect, servers

# The first test starts SGLang's HTTP server (shared with the corpus): minutes on a busy host.
pytestmark = pytest.mark.timeout(900)

MESSAGES = [{"role": "user", "content": "Say something"}]
LOGPROB_CASES = ("stop-token-id", "eos", "string-across-tokens")
CASES = ("string-across-tokens", "same-token-client-order", "one-token-string", "no-stop-trim",
         "stop-token-id", "eos")


def _case(name: str) -> dict[str, Any]:
    """The request fields of one case, built from the model's output pieces."""
    ids = expect.output_ids(40)
    pieces = [expect.decode([i]) for i in ids]
    a, b = pieces[1], pieces[2]  # two neighbouring tokens with text on both sides of the seam
    assert len(a) >= 3 and len(b) >= 3, pieces[:3]
    across = a[-3:] + b[:3]
    if name == "string-across-tokens":
        return {"stop": [across], "max_tokens": 20}
    if name == "same-token-client-order":
        # Both complete when token 2 arrives; the later-ending one is listed first.
        return {"stop": [b[:3], a[-2:] + b[:1]], "max_tokens": 20}
    if name == "one-token-string":
        return {"stop": [pieces[7]], "max_tokens": 20}
    if name == "no-stop-trim":
        return {"stop": [across], "no_stop_trim": True, "max_tokens": 20}
    if name == "stop-token-id":
        return {"stop_token_ids": [ids[5]], "max_tokens": 20}
    if name == "eos":
        return {"max_tokens": 60}  # the stand-in model ends with <|im_end|> at its 49th token
    raise AssertionError(name)


def _outcome(base: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """Text, finish reason, matched stop and completion tokens of one answer (streamed or not)."""
    chat = path.endswith("chat/completions")
    with httpx.Client(timeout=60) as c:
        if not body.get("stream"):
            r = c.post(base + path, json=body)
            assert r.status_code == 200, r.text
            data = r.json()
            choice = data["choices"][0]
            return {"text": choice["message"]["content"] if chat else choice["text"],
                    "finish_reason": choice["finish_reason"], "matched_stop": choice.get("matched_stop"),
                    "completion_tokens": data["usage"]["completion_tokens"]}
        text, finish, usage = [], None, None
        with c.stream("POST", base + path, json={**body, "stream_options": {"include_usage": True}}) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[len("data: "):])
                if event.get("usage"):
                    usage = event["usage"]["completion_tokens"]
                for choice in event.get("choices") or []:
                    piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                    text.append(piece or "")
                    finish = choice.get("finish_reason") or finish
        return {"text": "".join(text), "finish_reason": finish, "completion_tokens": usage}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"], ids=["chat", "completions"])
@pytest.mark.parametrize("case", CASES)
def test_the_answer_ends_where_sglangs_own_server_ends_it(
    front: servers.Process, sglang_http: servers.Process, case: str, path: str, stream: bool
) -> None:
    fields = _case(case)
    body: dict[str, Any] = {"model": servers.SERVED_MODEL, "stream": stream, **fields}
    body.update({"messages": MESSAGES} if path.endswith("chat/completions") else {"prompt": "Say something"})
    via_sglang = _outcome(sglang_http.extra["url"], path, body)
    via_gateway = _outcome(front.extra["url"], path, body)
    assert via_sglang["finish_reason"] == "stop"  # the case does stop on SGLang's own server
    assert via_gateway == via_sglang


def test_the_worker_gets_the_stop_strings_as_the_client_sent_them(
    gateway: servers.Process, recording: servers.Recording
) -> None:
    """The servicer has a tokenizer: the scheduler matches the strings itself, as behind
    SGLang's own frontends, and no stop id is derived from them."""
    fields = _case("same-token-client-order")
    with httpx.Client(timeout=60) as c:
        r = c.post(gateway.extra["url"] + "/v1/chat/completions",
                   json={"model": servers.SERVED_MODEL, "messages": MESSAGES, **fields})
    assert r.status_code == 200
    [rec] = recording.generates()
    assert rec["sampling_params"]["stop_strs"] == fields["stop"]
    assert not rec["sampling_params"]["stop_token_ids"]


def _logprobs(base: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The logprob entries of one answer (streamed or not): tokens, rounded logprobs and how
    many top entries each has, with the finish reason and the completion-token count."""
    chat = path.endswith("chat/completions")
    body = {**body, "logprobs": True, "top_logprobs": 2} if chat else {**body, "logprobs": 2}
    tokens: list[str] = []
    values: list[float] = []
    tops: list[int] = []
    finish, usage = None, None

    def take(choice: dict[str, Any]) -> None:
        lp = choice.get("logprobs") or {}
        if chat:
            for entry in lp.get("content") or []:
                tokens.append(entry["token"])
                values.append(round(entry["logprob"], 3))
                tops.append(len(entry.get("top_logprobs") or []))
        else:
            tokens.extend(lp.get("tokens") or [])
            values.extend(round(v, 3) for v in lp.get("token_logprobs") or [])
            tops.extend(len(t or {}) for t in lp.get("top_logprobs") or [])

    with httpx.Client(timeout=60) as c:
        if not body.get("stream"):
            r = c.post(base + path, json=body)
            assert r.status_code == 200, r.text
            data = r.json()
            take(data["choices"][0])
            finish, usage = data["choices"][0]["finish_reason"], data["usage"]["completion_tokens"]
        else:
            with c.stream("POST", base + path, json={**body, "stream_options": {"include_usage": True}}) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[len("data: "):])
                    if event.get("usage"):
                        usage = event["usage"]["completion_tokens"]
                    for choice in event.get("choices") or []:
                        take(choice)
                        finish = choice.get("finish_reason") or finish
    return {"tokens": tokens, "logprobs": values, "tops": tops, "finish_reason": finish, "completion_tokens": usage}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"], ids=["chat", "completions"])
@pytest.mark.parametrize("case", LOGPROB_CASES)
def test_the_stop_tokens_logprob_is_where_sglangs_own_server_puts_it(
    front: servers.Process, sglang_http: servers.Process, case: str, path: str, stream: bool
) -> None:
    """An answer that ends on a stop token (a stop id, the model's EOS) or a stop string
    carries logprob entries for exactly the tokens SGLang's own server gives them for."""
    body: dict[str, Any] = {"model": servers.SERVED_MODEL, "stream": stream, "temperature": 0, **_case(case)}
    body.update({"messages": MESSAGES} if path.endswith("chat/completions") else {"prompt": "Say something"})
    via_sglang = _logprobs(sglang_http.extra["url"], path, body)
    via_gateway = _logprobs(front.extra["url"], path, body)
    assert via_sglang["finish_reason"] == "stop"
    assert via_gateway == via_sglang
