"""What a request should produce in front of the stand-in: its prompt ids and its output.

The stand-in's model is ``standin.fake_model``; the prompt ids come from the model
folder's own tokenizer and chat template (``transformers``), independent of the
gateway's rendering.
"""

from __future__ import annotations

import functools
from typing import Any

from tests.interop_sglang import servers
from tests.interop_sglang.standin import fake_model


@functools.lru_cache(maxsize=1)
def hf_tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(servers.MODEL_DIR))


def chat_ids(messages: list[dict[str, str]]) -> list[int]:
    out = hf_tokenizer().apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out
    return list(ids)


def text_ids(text: str) -> list[int]:
    return list(hf_tokenizer().encode(text, add_special_tokens=False))


def output_ids(n_tokens: int, seed: int | None = None) -> list[int]:
    return fake_model.sequence(seed, n_tokens)


def output_text(n_tokens: int, seed: int | None = None) -> str:
    return hf_tokenizer().decode(output_ids(n_tokens, seed), skip_special_tokens=True)


def decode(ids: list[int]) -> str:
    return hf_tokenizer().decode(ids, skip_special_tokens=True)
