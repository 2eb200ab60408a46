"""Stop handling: which stops the worker enforces, which the gateway matches on text.

The gateway matches every stop string itself, whatever the worker: it detokenizes, and
a resumed generation goes on from the text it already sent. A worker that has its own
tokenizer (SGLang's servers, unless started with ``--skip-tokenizer-init``) is also sent
the client's stop strings as they are, exactly as SGLang's own frontends send them, so
it stops by itself where the gateway does. Workers started without a tokenizer cannot
match stop *strings*; for them ``StopPlan.build`` splits a request's stops:

* a stop string that is exactly one token is also sent to the worker as a stop token
  id, so the worker stops by itself on the common spelling (``<|im_end|>``,
  ``</think>``, a one-token word) and no abort round-trip is needed;
* every stop string whose text is visible in the output is matched on decoded text by
  ``StopMatcher`` (catching spellings that span several tokens);
* token stops (user ``stop_token_ids``, EOS unless ``ignore_eos``, and one-token stop
  strings that decode to nothing because they are special tokens being skipped) are
  matched on ids.

Reporting follows SGLang's ``matched_stop``: the string for a stop string, the token
id for a stop token or EOS.

A fired stop is final: the step that reports it (``StopStep.stopped``) tells the
caller to **abort the worker request now** (unless the worker already finished);
later feeds return nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gateway.tokenization.detokenizer import IncrementalDetokenizer
from gateway.tokenization.tokenizer import Tokenizer

Matched = str | int


@dataclass(slots=True)
class StopStep:
    """What one feed produced: text safe to send now, and the stop that fired, if any.

    Not frozen: one is built per relayed token, and a frozen dataclass's ``__init__``
    goes through ``object.__setattr__`` for every field. Treat it as read-only."""

    text: str
    matched: Matched | None = None
    ids_used: int | None = None
    """``SampleStream`` only: how many of the step's ids the output covers."""
    ids_through: int | None = None
    """``SampleStream`` only, on a token stop: the step's ids through the stop token (it is
    generated output, counted in completion tokens as SGLang counts it, though its text is
    trimmed). None: the same as ``ids_used``."""

    @property
    def stopped(self) -> bool:
        """True once a stop fired: send ``text``, finish the response with finish_reason
        "stop" and ``matched_stop=matched``, and abort the worker request."""
        return self.matched is not None


@dataclass(frozen=True)
class StopPlan:
    """A request's stops, split between the worker and the gateway."""

    stop_strings: tuple[str, ...] = ()
    """Matched by the gateway on decoded text, in the client's order."""
    stop_token_ids: tuple[int, ...] = ()
    """Send to the worker as ``SamplingParams.stop_token_ids``."""
    token_stops: Mapping[int, Matched] = field(default_factory=dict)
    """Ids the gateway treats as stops, and what to report for each."""
    string_token_ids: Mapping[int, str] = field(default_factory=dict)
    """One-token stop strings by id (the worker may report these as ``matched_token_id``)."""
    ignore_eos: bool = False
    worker_stop_strings: tuple[str, ...] = ()
    """Send to the worker as ``SamplingParams.stop`` (only to a worker that matches them)."""

    def matched_for_token(self, token_id: int) -> Matched:
        """What ``matched_stop`` to report when the worker says it stopped on ``token_id``:
        the client's stop string if the id came from one, else the id."""
        return self.string_token_ids.get(token_id, self.token_stops.get(token_id, token_id))

    @classmethod
    def build(
        cls,
        tokenizer: Tokenizer,
        stop: Sequence[str] | str | None = None,
        stop_token_ids: Iterable[int] | None = None,
        eos_token_ids: Iterable[int] | None = None,
        ignore_eos: bool = False,
        skip_special_tokens: bool = True,
        worker_matches_strings: bool = False,
    ) -> StopPlan:
        """``eos_token_ids`` defaults to the tokenizer's (merged with the worker's).
        With ``worker_matches_strings`` the worker gets the stop strings and the client's
        stop ids as sent (SGLang's own frontends' form), no ids derived from strings.

        A request with no stop strings or ids (most) gets the one plan of its EOS ids: it
        depends on nothing else, and plans are never changed once built (shared, their
        mappings are read only)."""
        if not stop and not stop_token_ids and eos_token_ids is None:
            key = (cls, tokenizer.eos_token_ids, ignore_eos)
            plan = _STOP_FREE.get(key)
            if plan is None:
                if len(_STOP_FREE) >= _STOP_FREE_MAX:
                    _STOP_FREE.clear()
                plan = _STOP_FREE[key] = cls._build(tokenizer, None, None, None, ignore_eos, skip_special_tokens, False)
            return plan
        return cls._build(tokenizer, stop, stop_token_ids, eos_token_ids, ignore_eos, skip_special_tokens, worker_matches_strings)

    @classmethod
    def _build(
        cls,
        tokenizer: Tokenizer,
        stop: Sequence[str] | str | None,
        stop_token_ids: Iterable[int] | None,
        eos_token_ids: Iterable[int] | None,
        ignore_eos: bool,
        skip_special_tokens: bool,
        worker_matches_strings: bool,
    ) -> StopPlan:
        strings: list[str] = []
        for s in [stop] if isinstance(stop, str) else list(stop or []):
            if s and s not in strings:  # an empty stop string would match everywhere
                strings.append(s)
        token_stops: dict[int, Matched] = {}
        if not ignore_eos:
            eos = tokenizer.eos_token_ids if eos_token_ids is None else eos_token_ids
            token_stops.update({int(i): int(i) for i in eos})
        user_ids = [int(i) for i in stop_token_ids or ()]
        token_stops.update({i: i for i in user_ids})
        worker_ids = list(dict.fromkeys(user_ids))
        string_ids: dict[int, str] = {}
        text_strings: list[str] = []
        for s in strings:
            tid = tokenizer.token_id(s)
            if tid is not None:
                string_ids.setdefault(tid, s)
                if tid not in worker_ids and not worker_matches_strings:
                    worker_ids.append(tid)
                if tokenizer.decode([tid], skip_special_tokens=skip_special_tokens) != s:
                    token_stops[tid] = s  # invisible in the text: only the id can match it
                    continue
            text_strings.append(s)
        return cls(
            stop_strings=tuple(text_strings),
            stop_token_ids=tuple(worker_ids),
            token_stops=token_stops,
            string_token_ids=string_ids,
            ignore_eos=ignore_eos,
            worker_stop_strings=tuple(strings) if worker_matches_strings else (),
        )


# The plans of stop-free requests by (class, EOS ids, ignore_eos): a handful per process
# (one per tokenizer and EOS set); cleared if ever that many.
_STOP_FREE: dict[tuple[type[StopPlan], frozenset[int], bool], StopPlan] = {}
_STOP_FREE_MAX = 64


class StopMatcher:
    """Text-level stop-string matching over a stream of text pieces (one per sample).

    Holds back the longest tail that could still become a stop string, so a stop split
    across tokens is never partly sent. Each ``feed`` is one step (the text of one
    token, as the caller feeds it): a stop string that is complete at an earlier step
    wins; among those complete at the same step, the first in the client's order wins,
    and the text is cut where that string first occurs. That is SGLang's rule (its
    scheduler checks the stop strings in order after every token, and its detokenizer
    trims the output at the matched string's first occurrence), so a worker and the
    gateway agree on which stop fired and where the text ends.
    """

    def __init__(self, stop_strings: Sequence[str], no_stop_trim: bool = False) -> None:
        self._stops = tuple(s for s in stop_strings if s)
        self._no_stop_trim = no_stop_trim
        self._held = ""
        self.matched: Matched | None = None

    @property
    def stopped(self) -> bool:
        return self.matched is not None

    @property
    def held_text(self) -> str:
        """Text kept back because it may be the start of a stop string."""
        return self._held

    def feed(self, text: str) -> StopStep:
        if self.stopped:
            return StopStep("")
        buffer = self._held + text
        # Every stop complete in ``buffer`` completed at this step (an earlier one would
        # have fired), and each starts inside it (the held tail covers any stop's prefix).
        for stop in self._stops:
            start = buffer.find(stop)
            if start >= 0:
                self._held = ""
                self.matched = stop
                return StopStep(buffer[: start + len(stop) if self._no_stop_trim else start], stop)
        keep = self._partial_match_length(buffer)
        self._held = buffer[len(buffer) - keep :] if keep else ""
        return StopStep(buffer[: len(buffer) - keep])

    def _partial_match_length(self, buffer: str) -> int:
        """Length of the longest tail of ``buffer`` that is a proper prefix of a stop."""
        longest = 0
        for stop in self._stops:
            for k in range(min(len(stop) - 1, len(buffer)), longest, -1):
                if buffer.endswith(stop[:k]):
                    longest = k
                    break
        return longest

    def stop_at_token(self, matched: Matched, token_text: str = "") -> StopStep:
        """A token stop fired: release held text (it can no longer complete), plus the
        token's own text when ``no_stop_trim``; the match is final."""
        if self.stopped:
            return StopStep("")
        text = self._held + (token_text if self._no_stop_trim else "")
        self._held = ""
        self.matched = matched
        return StopStep(text, matched)

    def finish(self) -> StopStep:
        """The output ended without a stop: release whatever was held back."""
        if self.stopped:
            return StopStep("")
        text, self._held = self._held, ""
        return StopStep(text)


class SampleStream:
    """One sample's output: worker token ids in, client text and stop decision out.

    Combines ``IncrementalDetokenizer`` and ``StopMatcher`` with the plan's token stops.
    Call ``step`` with each chunk's new ids; when ``StopStep.stopped``, abort the worker
    request. Call ``finish`` when the worker ends the sample without a gateway stop.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        plan: StopPlan,
        *,
        skip_special_tokens: bool = True,
        no_stop_trim: bool = False,
        context_ids: Sequence[int] = (),
        joined: bool = False,
    ) -> None:
        self._plan = plan
        # The caller only joins the steps' texts (a whole, not streamed answer): several ids
        # then go to the detokenizer in one call. A step's text may then hold back what one
        # id at a time would already have given (DecodeStream emits a call's text whole or
        # not at all); the joined text, stops and ids used are the same.
        self._joined = joined
        self._no_stop_trim = no_stop_trim
        self._detok = IncrementalDetokenizer(tokenizer, skip_special_tokens, context_ids)
        self._matcher = StopMatcher(plan.stop_strings, no_stop_trim)
        self._done = False
        # No stop string to match on text (the common request): the matcher would only
        # pass every piece through, so ``step`` skips it.
        self._plain = not self._matcher._stops

    @property
    def stopped(self) -> bool:
        return self._matcher.stopped

    @property
    def matched(self) -> Matched | None:
        return self._matcher.matched

    @property
    def plain(self) -> bool:
        """No stop string to match on text: only token stops can end the sample."""
        return self._plain

    def plain_stepper(self) -> Callable[[int], str]:
        """What gives ``step([token_id]).text`` of a ``plain`` stream for an id that is not
        a token stop, without the ``StopStep`` or a call of this stream's own: the relay's
        per-token call. Only while the sample is not done (the caller keeps track: a
        finished stream's detokenizer refuses more ids)."""
        return self._detok.step_one

    def step(self, token_ids: Sequence[int]) -> StopStep:
        """Feed one chunk's new ids. ``ids_used`` says how many of them the client's
        output covers (through the token that completed a stop string; up to a token
        stop, or through it with ``no_stop_trim``): trim ids and logprobs to it."""
        if self._done:
            return StopStep("", ids_used=0)
        if self._plain:
            return self._step_plain(token_ids)
        texts: list[str] = []
        for k, token_id in enumerate(token_ids):
            token_id = int(token_id)
            if token_id in self._plan.token_stops:
                return self._token_stop(texts, k, token_id)
            result = self._feed(self._detok.step([token_id]))
            texts.append(result.text)
            if result.stopped:
                return StopStep("".join(texts), result.matched, ids_used=k + 1)
        return StopStep("".join(texts), ids_used=len(token_ids))

    def _step_plain(self, token_ids: Sequence[int]) -> StopStep:
        """``step`` without stop strings: ids straight through the detokenizer; only a
        token stop can end the sample (the matcher holds nothing back, so it is skipped)."""
        token_stops = self._plan.token_stops
        detok_one = self._detok.step_one
        if len(token_ids) == 1:  # one token per worker message: the relay's common case
            token_id = int(token_ids[0])
            if token_id in token_stops:
                return self._token_stop([], 0, token_id)
            return StopStep(detok_one(token_id), None, 1)
        if self._joined:  # the ids before the first token stop, if any, in one call
            if not token_stops or token_stops.keys().isdisjoint(token_ids):
                return StopStep(self._detok.step_many(list(map(int, token_ids))), None, len(token_ids))
            k = next(i for i, token_id in enumerate(token_ids) if token_id in token_stops)
            head = self._detok.step_many(list(map(int, token_ids[:k]))) if k else ""
            return self._token_stop([head], k, int(token_ids[k]))
        texts: list[str] = []
        for k, token_id in enumerate(token_ids):
            token_id = int(token_id)
            if token_id in token_stops:
                return self._token_stop(texts, k, token_id)
            texts.append(detok_one(token_id))
        return StopStep("".join(texts), None, len(token_ids))

    def _token_stop(self, texts: list[str], k: int, token_id: int) -> StopStep:
        # Text up to the stop token (plus the token itself when not trimming) is final.
        used = k + 1 if self._no_stop_trim else k
        own = self._detok.step([token_id]) if self._no_stop_trim else ""
        result = self._feed(own + self._detok.flush())
        texts.append(result.text)
        if not result.stopped:
            self._done = True
            result = self._matcher.stop_at_token(self._plan.token_stops[token_id])
            texts.append(result.text)
        return StopStep("".join(texts), result.matched, ids_used=used, ids_through=k + 1)

    def _feed(self, text: str) -> StopStep:
        result = self._matcher.feed(text)
        if result.stopped:
            self._done = True
        return result

    def finish(self) -> StopStep:
        """The worker finished (length, its own stop, or abort): emit the rest."""
        if self._done:
            return StopStep("")
        self._done = True
        result = self._matcher.feed(self._detok.flush())
        if result.stopped:
            return result
        return StopStep(result.text + self._matcher.finish().text)


def apply_stops(
    tokenizer: Tokenizer,
    plan: StopPlan,
    output_ids: Sequence[int],
    *,
    skip_special_tokens: bool = True,
    no_stop_trim: bool = False,
) -> StopStep:
    """Non-streaming: the final text and matched stop for a whole output, with exactly
    the streaming semantics."""
    stream = SampleStream(
        tokenizer, plan, skip_special_tokens=skip_special_tokens, no_stop_trim=no_stop_trim
    )
    first = stream.step(output_ids)
    if first.stopped:
        return first
    rest = stream.finish()
    return StopStep(first.text + rest.text, rest.matched, ids_used=first.ids_used)
