r"""Reply token reuse: a reply sent back in the next turn is tokenized as the tokens
the model generated, not re-encoded from its text.

A worker's prefix cache holds, after a chat turn, the prompt ids followed by the ids
it *generated*. The client sends the reply back as text in the next turn, and BPE of
decoded text is not the generated sequence (a model may emit ``"Hel" "lo"`` where the
tokenizer would pick ``"Hello"``; on the simulated worker's random replies only about
22 of 64 tokens survive ``encode(decode(ids))``). Re-encoding therefore makes the next
turn's prompt diverge from the worker's cache inside the previous reply, and every
token after the divergence is computed again, on any worker.

``ReplyTokenCache`` remembers, per tenant, ``reply text -> generated ids`` for replies
whose ids decode to exactly that text. When a later rendered prompt contains such a
reply as an assistant message's content, ``encode_spliced`` tokenizes the text around
it as usual and that span as the recorded ids. With the previous prompt rendered the
same way (chat templates render history stably), the new prompt's ids are exactly the
previous prompt's ids followed by the generated ids, which is what the worker cached.

Why this is faithful: the recorded ids decode to exactly the span's text, so the spliced
prompt decodes to exactly the rendered text; the model reads the tokens it produced
itself, a tokenization at least as natural to it as the canonical one (it is what it
would have seen had the conversation continued without the round trip through text).

Isolation: entries are keyed by the request's cache salt (``pipeline.tenancy``), the
same key that separates tenants' KV caches, so one tenant's replies never shape another
tenant's prompt ids. Memory is bounded by entries and by bytes (text length in UTF-8
plus 4 bytes per id); least recently used entries go first. Pure and thread-safe.
"""

from __future__ import annotations

import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from gateway.tokenization.tokenizer import Tokenizer

Span = tuple[int, int, "array[int]"]
"""(start, end, ids): ``rendered[start:end]`` is tokenized as ``ids``."""


@dataclass(frozen=True)
class ReplyCacheStats:
    """Counters for metrics."""

    recorded: int  # replies stored
    rejected: int  # replies whose ids do not decode to their text (or too large)
    spliced_spans: int  # assistant messages tokenized as their recorded ids
    spliced_tokens: int
    entries: int
    bytes: int
    evictions: int


def _cost(text: str, ids: Sequence[int]) -> int:
    return len(text.encode("utf-8", "surrogatepass")) + 4 * len(ids)


class ReplyTokenCache:
    """Generated ids of recent replies, by (tenant salt, reply text)."""

    def __init__(self, tokenizer: Tokenizer, max_entries: int = 4096, max_bytes: int = 64 * 1024 * 1024) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise ValueError("max_entries and max_bytes must be positive")
        self.tokenizer = tokenizer
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[str, str], array[int]] = OrderedDict()
        self._costs: dict[tuple[str, str], int] = {}
        self._bytes = 0
        self._lock = threading.Lock()
        self._recorded = self._rejected = self._spans = self._tokens = self._evictions = 0

    # ------------------------------------------------------------------ recording
    def record(self, salt: str | None, text: str, ids: Sequence[int], stop_ids: Iterable[int] = ()) -> bool:
        """Remember that ``ids`` produced reply ``text`` for tenant ``salt``.

        Trailing end-of-sequence / stop-token ids are dropped (the template writes its own
        end-of-turn marker after the content). Recorded only when the remaining ids decode,
        special tokens included, to exactly ``text``: a reply whose text was cut by a stop
        string, stripped of a reasoning part, or parsed into tool calls does not qualify.
        """
        if not text or not ids:
            return False
        ends = self.tokenizer.eos_token_ids | frozenset(stop_ids)
        n = len(ids)
        while n and ids[n - 1] in ends:
            n -= 1
        kept = array("I", ids[:n])
        cost = _cost(text, kept)
        if not n or cost > self.max_bytes or self.tokenizer.decode(kept, skip_special_tokens=False) != text:
            with self._lock:
                self._rejected += 1
            return False
        key = (salt or "", text)
        with self._lock:
            old = self._costs.pop(key, None)
            if old is not None:
                self._bytes -= old
                del self._entries[key]
            self._entries[key] = kept
            self._costs[key] = cost
            self._bytes += cost
            self._recorded += 1
            self._evict()
        return True

    def _evict(self) -> None:
        while self._entries and (len(self._entries) > self.max_entries or self._bytes > self.max_bytes):
            key, _ = self._entries.popitem(last=False)
            self._bytes -= self._costs.pop(key)
            self._evictions += 1

    def lookup(self, salt: str | None, text: str) -> array[int] | None:
        """The recorded ids of reply ``text`` for tenant ``salt`` (touches the entry)."""
        key = (salt or "", text)
        with self._lock:
            ids = self._entries.get(key)
            if ids is not None:
                self._entries.move_to_end(key)
            return ids

    # ------------------------------------------------------------------ splicing
    def spans(self, salt: str | None, rendered: str, messages: Sequence[tuple[str, bool]]) -> list[Span]:
        """Where recorded replies sit in ``rendered``.

        ``messages`` are the conversation's (content text, is a plain assistant reply) in
        order. Each content is searched for from the end of the previous one found, so a
        reply quoted in an earlier message is not mistaken for the reply itself; a content
        the template changed (not found verbatim) is skipped, and so is its splice.
        """
        if not self._entries:
            return []
        wanted = [self.lookup(salt, text) if reply else None for text, reply in messages]
        for w in wanted:  # any reply known? (a plain loop: no generator per request)
            if w is not None:
                break
        else:
            return []
        spans: list[Span] = []
        cursor = 0
        for (text, _), ids in zip(messages, wanted, strict=True):
            if not text:
                continue
            at = rendered.find(text, cursor)
            if at < 0:
                continue
            cursor = at + len(text)
            if ids is not None:
                spans.append((at, cursor, ids))
        return spans

    def encode_spliced(self, rendered: str, spans: Sequence[Span], encode: Callable[[str], list[int]]) -> list[int]:
        """``rendered``'s ids: the text between spans through ``encode`` (each piece on
        its own, as the previous turn's prompt ended before the reply), the spans as
        their recorded ids."""
        ids: list[int] = []
        at = 0
        spliced = 0
        for start, end, span_ids in spans:
            if start > at:
                ids.extend(encode(rendered[at:start]))
            ids.extend(span_ids)
            spliced += len(span_ids)
            at = end
        if at < len(rendered):
            ids.extend(encode(rendered[at:]))
        with self._lock:
            self._spans += len(spans)
            self._tokens += spliced
        return ids

    def stats(self) -> ReplyCacheStats:
        with self._lock:
            return ReplyCacheStats(
                recorded=self._recorded,
                rejected=self._rejected,
                spliced_spans=self._spans,
                spliced_tokens=self._tokens,
                entries=len(self._entries),
                bytes=self._bytes,
                evictions=self._evictions,
            )

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._costs.clear()
            self._bytes = 0


def message_texts(messages: Sequence[dict[str, object]]) -> list[tuple[str, bool]]:
    """(text, is an assistant reply) for each text a conversation's messages carry, in
    order (the text parts of a content list each on their own, never replies)."""
    out: list[tuple[str, bool]] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            out.append((content, message.get("role") == "assistant"))
        elif isinstance(content, list):
            out.extend((p["text"], False) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return out
