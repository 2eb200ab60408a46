"""Incremental detokenization for streaming responses.

Built on ``tokenizers.decoders.DecodeStream`` (HF tokenizers >= 0.21), which keeps a
small window of ids, holds text back while it ends in an incomplete UTF-8 sequence
(decoded as U+FFFD), and keeps one token of left context so leading-space rules
(SentencePiece/Metaspace) apply as they would in the full text.

What is added here:

* ``flush()``: DecodeStream has no end-of-stream call, so text it still holds (an
  incomplete byte sequence at the very end, or a real U+FFFD) would be lost. We keep
  the output ids and emit the rest of ``decode(all ids)`` on flush.
* Recovery: if DecodeStream ever reports an inconsistent prefix, the stream switches
  to recomputing from the full decode, so a client stream never breaks.
* Byte-level vocabularies: where the tokenizer has the bytes of its ids
  (``Tokenizer.token_bytes``: a ``ByteLevel`` decoder alone), the bytes not yet shown are
  kept and decoded here, with ``DecodeStream``'s rule (text that ends in U+FFFD is held
  back), instead of ``DecodeStream``'s two decodes of its window per token: the same
  texts, at a fraction of the relayed token's cost.
* Stream start: by default the stream starts empty, so the joined text equals
  ``tokenizer.decode(output_ids)``, which is what a non-streaming response returns.
  For ByteLevel tokenizers (Qwen, Llama 3) seeding with prompt ids gives the same
  text; for Metaspace tokenizers seeding keeps the first token's leading space, which
  is what a *continued* message wants (``continue_final_message``). Pass
  ``context_ids`` for that case; the joined text is then
  ``decode(context + output)`` minus ``decode(context)``.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers.decoders import DecodeStream

from gateway.tokenization.tokenizer import Tokenizer

_REPLACEMENT = "\ufffd"
# Prompt ids used to seed a stream: a few tokens are enough context for any decoder.
_CONTEXT_TOKENS = 8


class IncrementalDetokenizer:
    """Turns one sample's output ids into text chunks; one instance per sample."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        skip_special_tokens: bool = True,
        context_ids: Sequence[int] = (),
    ) -> None:
        self._tokenizer = tokenizer
        self._backend = tokenizer.backend
        self._skip = skip_special_tokens
        self._context = self._clean_context(context_ids)
        self._context_text = self._decode(self._context) if self._context else ""
        self._stream = DecodeStream(
            ids=self._context or None, skip_special_tokens=skip_special_tokens
        )
        self._ids: list[int] = []
        # The bytes of byte-level ids (None: DecodeStream decodes) and those not yet shown.
        # Seeding needs nothing from them: a context that ends inside a character is dropped.
        bytes_of = tokenizer.token_bytes(skip_special_tokens) if isinstance(tokenizer, Tokenizer) else None
        self._bytes: dict[int, bytes] | None = bytes_of.table if bytes_of is not None else None
        self._fill = bytes_of.fill if bytes_of is not None else None
        self._held = b""
        self._emitted_chars = 0
        self._pending = 0  # ids fed since the last emitted text
        self._fallback = False
        self._flushed = False

    def _decode(self, ids: Sequence[int]) -> str:
        if isinstance(self._tokenizer, Tokenizer):  # its decode (a joined model's may read tables, not the backend)
            return self._tokenizer.decode(list(ids), skip_special_tokens=self._skip)
        return self._backend.decode(list(ids), skip_special_tokens=self._skip)

    def _clean_context(self, context_ids: Sequence[int]) -> list[int]:
        """The last few context ids, dropped entirely if they end inside a character
        (DecodeStream would otherwise re-emit them as output)."""
        tail = [int(i) for i in context_ids[-_CONTEXT_TOKENS:]]
        if tail and self._decode(tail).endswith(_REPLACEMENT):
            return []
        return tail

    @property
    def output_ids(self) -> list[int]:
        """Every id fed so far (a copy)."""
        return list(self._ids)

    def full_text(self) -> str:
        """The whole output text as one decode would give it (the flush target)."""
        text = self._decode(self._context + self._ids)
        if self._context and text.startswith(self._context_text):
            return text[len(self._context_text) :]
        return self._decode(self._ids) if self._context else text

    def step(self, token_ids: Sequence[int]) -> str:
        """Feed new ids; return the text that is now final ('' while a character is incomplete)."""
        if self._flushed:
            raise RuntimeError("step() after flush(): use a new IncrementalDetokenizer")
        if len(token_ids) == 1:
            return self.step_one(int(token_ids[0]))
        return "".join([self.step_one(int(token_id)) for token_id in token_ids])

    def step_many(self, token_ids: list[int]) -> str:
        """Several ids in one ``DecodeStream`` call, for a caller that only joins the texts
        (a whole answer: one call instead of one per id). DecodeStream emits all of a call's
        text or none of it (none while it ends in an incomplete character), so this may hold
        back text that ``step`` would give now; the joined text (``flush`` included) is the same."""
        if self._flushed:
            raise RuntimeError("step() after flush(): use a new IncrementalDetokenizer")
        if not token_ids:
            return ""
        self._ids.extend(token_ids)
        self._pending += len(token_ids)
        return self._advance(token_ids)

    def step_one(self, token_id: int) -> str:
        """``step([token_id])`` without the list (the relay feeds one id per worker message;
        ``_advance``'s common case inline, one call fewer per token)."""
        if self._flushed:
            raise RuntimeError("step() after flush(): use a new IncrementalDetokenizer")
        self._ids.append(token_id)
        self._pending += 1
        table = self._bytes
        if table is not None:
            raw = table.get(token_id)
            if raw is None:
                raw = self._fill(token_id)  # type: ignore[misc]
            held = self._held + raw if self._held else raw
            if not held:
                return ""
            text = held.decode("utf-8", "replace")
            if text[-1] == _REPLACEMENT:
                self._held = held
                return ""
            self._held = b""
            self._pending = 0
            self._emitted_chars += len(text)
            return text
        if self._fallback:
            return self._advance(token_id)
        try:
            piece = self._stream.step(self._backend, token_id)
        except Exception:
            # DecodeStream raised (inconsistent prefix): stop trusting its state.
            self._fallback = True
            piece = self._step_from_full_text()
        if piece is None:
            return ""
        self._pending = 0
        self._emitted_chars += len(piece)
        return piece

    def _advance(self, step_arg: int | list[int]) -> str:
        """Feed ids already appended to ``_ids`` to DecodeStream (one id or a list)."""
        table = self._bytes
        if table is not None:
            ids = [step_arg] if isinstance(step_arg, int) else step_arg
            held = b"".join([self._held, *[table.get(i) or self._fill(i) for i in ids]])  # type: ignore[misc]
            text = held.decode("utf-8", "replace")
            if not text or text[-1] == _REPLACEMENT:
                self._held = held
                return ""
            self._held = b""
            self._pending = 0
            self._emitted_chars += len(text)
            return text
        if self._fallback:
            piece = self._step_from_full_text()
        else:
            try:
                piece = self._stream.step(self._backend, step_arg)
            except Exception:
                # DecodeStream raised (inconsistent prefix): stop trusting its state.
                self._fallback = True
                piece = self._step_from_full_text()
        if piece is None:
            return ""
        self._pending = 0
        self._emitted_chars += len(piece)
        return piece

    def _step_from_full_text(self) -> str | None:
        text = self.full_text()
        if text.endswith(_REPLACEMENT) or len(text) <= self._emitted_chars:
            return None
        return text[self._emitted_chars :]

    def flush(self) -> str:
        """End of stream: return whatever is still held back (e.g. a trailing broken byte
        sequence, as U+FFFD exactly where ``decode`` puts it). Ends the stream."""
        self._flushed = True
        if self._pending == 0:
            return ""
        self._pending = 0
        text = self.full_text()
        rest = text[self._emitted_chars :]
        self._emitted_chars = max(self._emitted_chars, len(text))
        return rest
