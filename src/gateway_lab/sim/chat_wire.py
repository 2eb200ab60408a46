"""SGLang's OpenAI chat route for the simulated HTTP worker: messages in, chat objects out.

A gateway that forwards OpenAI requests unchanged (SMG over HTTP, a text relay) sends the
worker ``/v1/chat/completions``; SGLang's server renders the model's chat template with
Hugging Face's ``apply_chat_template`` and tokenizes the text itself. The simulator does
the same with the same library (not the gateway's own renderer), so a chat workload sent
as text reaches the radix cache as the tokens a real server would see. The answer is the
completions route's, reshaped into ``chat.completion`` objects (streamed as
``chat.completion.chunk`` deltas, the first of each choice naming the assistant role).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway_lab.sim.http_wire import BadBody

Render = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None], str]

# Chat sampling fields with the same name and meaning on the completions route.
_SAME = ("temperature", "top_p", "top_k", "n", "min_tokens", "stop_token_ids", "ignore_eos", "seed",
         "repetition_penalty", "stream", "stream_options")  # fmt: skip


@functools.lru_cache(maxsize=4)
def chat_renderer(tokenizer_dir: Path) -> Render:
    """The chat template of the tokenizer in ``tokenizer_dir``, rendered by transformers as
    SGLang's server renders it (loaded once per process: the load takes seconds)."""
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")  # its "PyTorch was not found" banner
    from transformers import PreTrainedTokenizerFast  # a heavy import, paid by the first chat only

    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(tokenizer_dir))

    def render(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
        if not isinstance(text, str):  # pragma: no cover - tokenize=False always renders text
            raise BadBody("the chat template rendered no text")
        return text

    return render


def completion_body(body: Any, render: Render) -> dict[str, Any]:
    """A ``/v1/chat/completions`` body as the completions route's body with a text prompt.
    Raises :class:`BadBody` for what SGLang's server refuses with a 400."""
    if not isinstance(body, dict):
        raise BadBody("the body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise BadBody("messages must be a non-empty list of objects")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise BadBody("tools must be a list")
    try:
        prompt = render(messages, tools)
    except BadBody:
        raise
    except Exception as exc:  # the template's own refusal (a role it does not know, ...)
        raise BadBody(f"the chat template could not render these messages: {exc}") from exc
    out: dict[str, Any] = {k: body[k] for k in _SAME if body.get(k) is not None}
    most = body.get("max_completion_tokens", body.get("max_tokens"))
    if most is not None:
        out["max_tokens"] = most
    out["prompt"] = prompt
    return out


class ChatShape:
    """Turns the completions route's objects for one request into chat objects."""

    def __init__(self, streamed: bool) -> None:
        self.streamed = streamed
        self._named: set[int] = set()  # the choices whose role was sent

    def __call__(self, answer: dict[str, Any]) -> dict[str, Any]:
        out = dict(answer)
        out["id"] = "chatcmpl-" + str(answer["id"]).removeprefix("cmpl-")
        out["object"] = "chat.completion.chunk" if self.streamed else "chat.completion"
        out["choices"] = [self._choice(c) for c in answer.get("choices") or []]
        return out

    def _choice(self, choice: dict[str, Any]) -> dict[str, Any]:
        index = choice["index"]
        out: dict[str, Any] = {"index": index}
        if self.streamed:
            delta: dict[str, Any] = {"content": choice["text"]}
            if index not in self._named:
                delta = {"role": "assistant", **delta}
                self._named.add(index)
            out["delta"] = delta
        else:
            out["message"] = {"role": "assistant", "content": choice["text"]}
        out["finish_reason"] = choice["finish_reason"]
        out["matched_stop"] = choice["stop_reason"]  # SGLang's name for what ended the choice
        return out


__all__ = ["ChatShape", "chat_renderer", "completion_body"]
