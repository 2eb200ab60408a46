"""Run one prepared generation on a worker and turn its token stream into text.

This is where the worker's per-sample token ids become per-sample text deltas:
each sample gets its own incremental detokenizer and stop matcher. Stop strings
are the gateway's job (real workers reject string stops), and the moment every
sample has stopped the worker request is cancelled and aborted, so the GPU does
not keep generating tokens nobody will see. A worker that fails after output
started is replaced mid-stream by a continuation (``pipeline/resume.py``): the
samples' text state carries over, so the client sees one uninterrupted stream.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, overload

from gateway.pipeline.dispatch import TokenStream
from gateway.pipeline.output_guard import OutputGuard
from gateway.pipeline.prepared import PreparedRequest
from gateway.pipeline.resume import Resumer
from gateway.pipeline.running_loop import running_loop
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.protocol.errors import GatewayError, WorkerError
from gateway.tokenization.stops import SampleStream

log = logging.getLogger(__name__)

TopRow = list[tuple[int, float]]


@dataclass(slots=True)
class SampleDelta:
    """New output of one sample: text now safe to show, and the tokens behind it."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None
    top_logprobs: list[TopRow] | None = None
    finish_reason: str | None = None  # set on the sample's last delta
    matched_stop: int | str | None = None
    stop_token: int | None = None
    """The stop token (a stop id, EOS) the sample ended on: generated and counted, its text
    trimmed, and, as SGLang's own server reports it, the last entry of ``logprobs``."""
    at: int = 0
    """Where in the sample's output ids (``Generation.output_ids``) this delta's tokens begin:
    the ids before it that no delta carried came as texts (``deltas(texts=True)``)."""

    @property
    def logprob_ids(self) -> list[int]:
        """The tokens ``logprobs`` (and ``top_logprobs``) are for: ``token_ids``, then the
        stop token when the sample ended on one and logprobs were asked for."""
        if self.stop_token is None:
            return self.token_ids
        return [*self.token_ids, self.stop_token]


class TextSink(Protocol):
    """Where a generation pushes the texts of ordinary tokens as they arrive (``push_to``)."""

    def ready(self) -> bool: ...  # it would write now, without waiting

    def write(self, texts: list[str]) -> None: ...  # the texts of tokens that arrived together


@dataclass(slots=True)
class UsageCounts:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0  # as the worker reports it; the chat endpoint counts its own
    per_sample_completion: dict[int, int] = field(default_factory=dict)


@dataclass(slots=True)
class _Sample:
    index: int
    text: SampleStream
    generated: int = 0  # tokens the worker produced for this sample
    ids: list[int] = field(default_factory=list)  # those tokens (a continuation's input)
    saw_chunks: bool = False
    done: bool = False


def _logprob_rows(lp: pb.OutputLogProbs, top_n: int) -> tuple[list[float], list[TopRow] | None]:
    values = list(lp.token_logprobs)
    if top_n <= 0:
        return values, None
    tops = [list(zip(row.token_ids, row.values, strict=False))[:top_n] for row in lp.top_logprobs]
    return values, tops


class Generation:
    """Iterate to get ``SampleDelta``s; ``usage`` is complete once iteration ends."""

    def __init__(self, stream: TokenStream, prepared: PreparedRequest, resumer: Resumer | None = None) -> None:
        self.stream = stream
        self._resumer = resumer
        self._resumed = False  # a continuation's prompt/cached counts are not the request's
        self._texts = False  # deltas(): ordinary tokens come as text lists (see ``deltas``)
        self.prepared = prepared
        self.usage = UsageCounts(prompt_tokens=len(prepared.prompt_ids))
        options = prepared.sampling
        self._token_stops = prepared.stop_plan.token_stops
        self._samples = [
            _Sample(
                i,
                SampleStream(
                    prepared.tokenizer,
                    prepared.stop_plan,
                    skip_special_tokens=options.skip_special_tokens,
                    no_stop_trim=options.no_stop_trim,
                    joined=not prepared.stream,  # a whole answer: its texts are only joined
                ),
            )
            for i in range(options.n)
        ]
        self._open = len(self._samples)
        self._step_plain = self._samples[0].text.plain_stepper()  # ``_plain_token``'s detokenizer step
        self._want_logprobs = prepared.sampling.logprobs
        self._top_n = prepared.sampling.top_logprobs if prepared.sampling.logprobs else 0
        self.input_logprobs: pb.InputLogProbs | None = None
        self._stopped_early = False  # a sample ended here before the worker said so
        self._guard = OutputGuard.for_request(prepared)
        # The times of the first and the latest message, and each later one's gap per token.
        self._first_at = 0.0
        self._last_at = 0.0
        self._gaps: list[float] = []
        self._sink: TextSink | None = None  # where ordinary tokens' texts go as they arrive (``push_to``)
        self._taken: list[str] | None = None  # the texts taken in the delivery under way

    def output_ids(self, index: int) -> list[int]:
        """Every token the worker generated for sample ``index`` (continuations included,
        tokens past a gateway-matched stop too)."""
        sample = self._sample(index)
        return sample.ids if sample is not None else []

    @property
    def worker_id(self) -> str:
        return self.stream.worker.id

    @property
    def plain(self) -> bool:
        """The relay's common request: one sample, no logprobs, no stop string matched on
        text (``deltas(texts=True)`` then gives the text alone for nearly every token)."""
        return len(self._samples) == 1 and not self._want_logprobs and self._samples[0].text.plain

    @overload
    def deltas(self, *, texts: Literal[False] = False) -> AsyncIterator[SampleDelta]: ...

    @overload
    def deltas(self, *, texts: bool) -> AsyncIterator[list[str] | SampleDelta]: ...

    def deltas(self, *, texts: bool = False) -> AsyncIterator[list[str] | SampleDelta]:
        """The output, read once, as per-sample ``SampleDelta``s.

        With ``texts``, a ``plain`` request's ordinary tokens (one id in a chunk of sample
        0, not a token stop) come as their texts alone, in a ``list``, and only when not
        empty: no delta object per token. A list holds the texts of the tokens that
        arrived together (the worker stream was ``ready`` with the next one), handed over
        before the generation waits for the worker, so a consumer writes them at once and
        never holds one back. Everything else (token stops, chunks of several ids, the
        sample's end, a resumption) is the delta it would be without ``texts``, after the
        texts before it, so a consumer that turns each text x into what it would make of
        ``SampleDelta(0, x, [id])`` sends the same bytes. A request that is not ``plain``
        gets deltas only either way."""
        self._texts = texts and self.plain
        return self._run(self.plain)

    async def _run(self, fast: bool) -> AsyncIterator[list[str] | SampleDelta]:
        clock = time.perf_counter
        batch: list[str] = []  # texts of tokens that arrived together, not handed over yet
        texts = fast and self._texts
        plain_run = self._plain_run
        reader: TokenStream | None = None  # the stream ``read_arrived`` belongs to (a resumption brings another)
        read_arrived: Callable[[], list[pb.GenerateResponse]] | None = None
        arrived: list[pb.GenerateResponse] = []  # messages that came together, taken in one call
        at = 0  # the next of them
        now = 0.0  # when they were taken (one time for the lot: they arrived together)
        try:
            while self._open:
                stream = self.stream
                if stream is not reader:
                    reader, read_arrived = stream, getattr(stream, "read_arrived", None)
                    arrived, at = [], 0
                if at < len(arrived):
                    msg = arrived[at]
                    at += 1
                else:
                    # Messages that have arrived are read without the read's coroutines.
                    arrived = read_arrived() if read_arrived is not None else []
                    if arrived:
                        msg, at = arrived[0], 1
                        now = clock()
                    else:
                        at = 0
                        if batch and (read_arrived is not None or not stream.ready()):
                            yield batch  # about to wait (or to meet the end): hand over what came
                            batch = []
                        try:
                            got = await stream.read()
                            if got is None:
                                missing = [s.index for s in self._samples if not s.done]
                                raise WorkerError(
                                    f"worker {self.worker_id} ended the stream before samples {missing} finished"
                                )
                        except GatewayError as exc:
                            if batch:
                                yield batch
                                batch = []
                            for delta in await self._resume(exc):
                                yield delta
                            continue
                        msg = got
                        arrived, at = [got], 1
                        now = clock()
                if texts:
                    # The ordinary tokens from here on, in one loop; the first that is not
                    # goes the general way.
                    stop = plain_run(arrived, at - 1, now, batch)
                    if stop == len(arrived):
                        at = stop
                        continue
                    if stop >= at:
                        msg, at = arrived[stop], stop + 1
                which = msg.WhichOneof("response")
                if which == "chunk":
                    chunk = msg.chunk
                    n_ids = len(chunk.token_ids)
                    if self._first_at:
                        self._gaps.append((now - self._last_at) / (n_ids or 1))
                    else:
                        self._first_at = now
                    self._last_at = now
                    if batch:
                        yield batch
                        batch = []
                    for delta in self._on_chunk(chunk):
                        yield delta
                elif which == "complete":
                    if not self._first_at:
                        self._first_at = now
                    self._last_at = now
                    if batch:
                        yield batch
                        batch = []
                    for delta in self._on_complete(msg.complete):
                        yield delta
            if batch:
                yield batch
        finally:
            if self._sink is not None:
                self.push_to(None)
            first, last, gaps = self._first_at, self._last_at, self._gaps
            if self._open or self._stopped_early:
                # A stop matched here, or the consumer left: the worker must stop now.
                await self.stream.aclose()
                self._account(first, last, gaps)
            elif self.prepared.stream:
                self.stream.finished()
                self._report_output()
                self._account(first, last, gaps)
            else:
                # A whole answer: the call's end, the lease's release and the policy's
                # output learning run right after the answer is built and written (the
                # next loop turn's callbacks, before any new request's task), not before
                # it (they would add to the answer's latency), and so do its timing histograms
                # (the times were taken as the tokens came). The request's own record
                # (the access log's worker and tokens) is filled now.
                running_loop().call_soon(self._finish_whole, first, last, gaps)
                self._account(first, last, gaps, timing=False)

    def _plain_run(self, arrived: Sequence[pb.GenerateResponse], at: int, now: float, texts: list[str]) -> int:
        """``_plain_token`` for the messages at ``arrived[at:]``, which came together at
        ``now``, while each is an ordinary token, their texts (those not empty) appended to
        ``texts``. Returns the index of the first message that is not one (it goes the
        general way); ``at`` when none was taken."""
        plain_token = self._plain_token
        end = len(arrived)
        while at < end:
            msg = arrived[at]
            if msg.WhichOneof("response") != "chunk":
                break
            piece = plain_token(msg.chunk, now)
            if piece is None:
                break
            if piece:
                texts.append(piece)
            at += 1
        return at

    def _plain_token(self, chunk: pb.GenerateStreamChunk, now: float) -> str | None:
        """Take an ordinary token of a ``plain`` request (one id in a chunk of sample 0, not
        a token stop, within the output guard's bounds) into sample 0 and return its text
        (empty while its bytes are incomplete): ``_on_chunk`` + ``_feed`` for this case,
        without the delta objects (input logprobs come only when logprobs are asked for).
        None: not such a token, nothing taken (it goes the general way)."""
        ids = chunk.token_ids  # each proto field read has a cost: read once each
        if len(ids) != 1:
            return None
        token_id = ids[0]
        sample0 = self._samples[0]
        guard = self._guard
        if (
            token_id in self._token_stops or chunk.index or sample0.done
            or token_id >= guard.vocab or sample0.generated >= guard.cap  # else the guard's path
        ):
            return None
        if self._first_at:
            self._gaps.append(now - self._last_at)
        else:
            self._first_at = now
        self._last_at = now
        if not self._resumed:
            usage = self.usage
            prompt, cached = chunk.prompt_tokens, chunk.cached_tokens
            if prompt:
                usage.prompt_tokens = prompt
            if cached > usage.cached_tokens:
                usage.cached_tokens = cached
        sample0.saw_chunks = True
        sample0.generated += 1
        sample0.ids.append(token_id)
        self.usage.per_sample_completion[0] = sample0.generated
        return self._step_plain(token_id)

    def push_to(self, sink: TextSink | None) -> bool:
        """From now on, while the generation waits for its worker, hand the texts of the
        ordinary tokens that arrive to ``sink`` there and then (in the worker connection's
        read callback: no wake-up of the consumer, no delta, no generator step per token);
        the consumer wakes for everything else (``deltas`` yields it, in order, after the
        texts before it), and whenever ``sink`` is not ``ready`` (it would have to wait: the
        texts then come through ``deltas`` and the consumer's own wait). Only on the text
        path (``deltas(texts=True)`` of a ``plain`` request) and on a stream that can
        (``WorkerStream.listen``); False otherwise. None stops it."""
        if sink is not None and not self._texts:
            return False
        self._sink = sink
        listen = getattr(self.stream, "listen", None)
        return listen is not None and bool(listen(self if sink is not None else None))

    def offer(self, msg: pb.GenerateResponse) -> bool:
        """``PushTarget.offer``: take ``msg`` if it is an ordinary token and the sink can
        write this delivery's texts now (asked once per delivery, before the first is taken)."""
        if msg.WhichOneof("response") != "chunk" or self._sink is None:
            return False
        taken = self._taken
        if taken is None:
            if not self._sink.ready():
                return False
            taken = []
        piece = self._plain_token(msg.chunk, time.perf_counter())
        if piece is None:
            return False
        self._taken = taken
        if piece:
            taken.append(piece)
        return True

    def flush(self) -> None:
        """``PushTarget.flush``: the delivery's texts to the sink, in one piece."""
        taken, self._taken = self._taken, None
        if taken and self._sink is not None:
            self._sink.write(taken)

    def _finish_whole(self, first: float, last: float, gaps: list[float]) -> None:
        try:
            self.stream.finished()
            self._report_output()
            self._timing(first, last, gaps)
        except Exception:
            log.exception("request %s: bookkeeping after the answer failed", self.prepared.request_id)

    def _account(self, first: float, last: float, gaps: list[float], *, timing: bool = True) -> None:
        u = self.usage
        self.stream.observer.generation_done(
            self.prepared.model, self.worker_id, prompt_tokens=u.prompt_tokens,
            completion_tokens=sum(u.per_sample_completion.values()), cached_tokens=u.cached_tokens,
        )
        if timing:
            self._timing(first, last, gaps)

    def _timing(self, first: float, last: float, gaps: list[float]) -> None:
        if first:
            self.stream.observer.generation_timing(
                self.prepared.model, self.worker_id, first_token_at=first, last_token_at=last,
                output_tokens=sum(self.usage.per_sample_completion.values()), token_gaps=gaps,
            )

    def _report_output(self) -> None:
        """Tell a cache-aware policy what the worker now also caches: the output of a
        single-sample request that finished on the worker it was routed to."""
        if len(self._samples) != 1 or self._resumed:
            return
        self.stream.output(self._samples[0].ids)

    async def _resume(self, error: GatewayError) -> list[SampleDelta]:
        """Continue the unfinished samples elsewhere, or re-raise ``error`` (with why not)."""
        failed = self.worker_id
        if not self.stream.closed:
            await self.stream.abort("resuming elsewhere")  # PD or multiplexed siblings still open
        resumer = self._resumer
        why = "no resumer" if resumer is None else resumer.check(error)
        if why is not None:
            if resumer is not None and why != "not a worker failure":
                error.message = f"{error.message} (not resumed: {why})"
                error.args = (error.message,)
            try:
                raise error
            finally:
                del error  # its traceback holds this frame: no cycle through it
        assert resumer is not None
        out: list[SampleDelta] = []
        pending: list[tuple[int, list[int]]] = []
        budget = self.prepared.sampling.max_new_tokens
        for sample in self._samples:
            if sample.done:
                continue
            if budget is not None and sample.generated >= budget:
                # Its last token arrived but the worker failed before saying it was done.
                step = sample.text.finish()
                self._close(sample)
                out.append(SampleDelta(sample.index, step.text, finish_reason="length", at=len(sample.ids)))
                continue
            sample.saw_chunks = False
            pending.append((sample.index, sample.ids))
        if not pending:
            return out
        log.warning(
            "request %s: worker %s failed after output (%s); resuming %d sample(s) elsewhere (resume %d)",
            self.prepared.request_id, failed, error.message, len(pending), resumer.resumes + 1,
        )
        self.stream = await resumer.resume(failed, pending)
        self._resumed = True
        if self._sink is not None:
            self.push_to(self._sink)  # the continuation's stream pushes as the first did
        return out

    def _sample(self, index: int) -> _Sample | None:
        if 0 <= index < len(self._samples):
            return self._samples[index]
        return None

    def _next_whole_sample(self) -> _Sample | None:
        """Where a whole answer's complete goes when its index names a finished sample:
        SGLang's servicer sets the index on its streamed path only and sends every
        unstreamed completion with index 0, so such completes (no chunk came for any
        sample) fill the samples in the order they arrive."""
        if any(s.saw_chunks for s in self._samples):
            return None
        return next((s for s in self._samples if not s.done), None)

    def _on_chunk(self, chunk: pb.GenerateStreamChunk) -> list[SampleDelta]:
        if not self._resumed:
            usage = self.usage
            prompt, cached = chunk.prompt_tokens, chunk.cached_tokens
            if prompt:
                usage.prompt_tokens = prompt
            if cached > usage.cached_tokens:
                usage.cached_tokens = cached
            if self.input_logprobs is None and chunk.HasField("input_logprobs"):
                self.input_logprobs = chunk.input_logprobs
        sample = self._sample(chunk.index)
        if sample is None or sample.done:
            return []
        sample.saw_chunks = True
        lp = chunk.output_logprobs if self._want_logprobs and chunk.HasField("output_logprobs") else None
        return self._feed(sample, chunk.token_ids, lp)

    def _on_complete(self, done: pb.GenerateComplete) -> list[SampleDelta]:
        if not self._resumed:
            if done.prompt_tokens:
                self.usage.prompt_tokens = done.prompt_tokens
            self.usage.cached_tokens = max(self.usage.cached_tokens, done.cached_tokens)
            if done.HasField("input_logprobs") and self.input_logprobs is None:
                self.input_logprobs = done.input_logprobs
        self.usage.reasoning_tokens += done.reasoning_tokens
        sample = self._sample(done.index)
        if sample is None or sample.done:
            sample = self._next_whole_sample()
            if sample is None:
                return []
        out: list[SampleDelta] = []
        if not sample.saw_chunks:
            lp = done.output_logprobs if self._want_logprobs and done.HasField("output_logprobs") else None
            out.extend(self._feed(sample, done.output_ids, lp))
            if sample.done:
                return out
        matched: int | str | None = None
        kind = done.WhichOneof("matched_stop")
        if kind == "matched_token_id":
            matched = self.prepared.stop_plan.matched_for_token(done.matched_token_id)
        elif kind == "matched_stop_str":
            matched = done.matched_stop_str
        step = sample.text.finish()
        self._close(sample)
        delta = SampleDelta(
            sample.index, step.text, finish_reason=done.finish_reason or "stop", matched_stop=matched, at=len(sample.ids),
        )
        if kind == "matched_token_id" and self._want_logprobs:
            self._stop_row(delta, done)
        out.append(delta)
        return out

    def _stop_row(self, delta: SampleDelta, done: pb.GenerateComplete) -> None:
        """The stop token arrived in the complete only (no chunk carried it): its logprob row
        is the complete's last, reported as SGLang's own server reports it."""
        lp = done.output_logprobs
        token = done.matched_token_id
        if not done.output_ids or done.output_ids[-1] != token or not lp.token_logprobs:
            return
        values, tops = _logprob_rows(lp, self._top_n)
        delta.logprobs = values[-1:]
        delta.top_logprobs = tops[-1:] if tops else None
        delta.stop_token = token

    def _feed(self, sample: _Sample, worker_ids: Sequence[int], lp: pb.OutputLogProbs | None) -> list[SampleDelta]:
        """Worker tokens through the output guard, the sample's detokenizer and stop matching."""
        ids, over = self._guard.admit(
            worker_ids, sample.generated, request_id=self.prepared.request_id, worker_id=self.worker_id, index=sample.index
        )
        sample.generated += len(ids)
        at = len(sample.ids)
        sample.ids.extend(ids)
        self.usage.per_sample_completion[sample.index] = sample.generated
        step = sample.text.step(ids)
        stop_token: int | None = None
        if step.matched is not None:  # step.stopped, without the property call per token
            # Tokens past the stop never reach the client (nor their logprobs), nor its
            # usage: completion tokens count through the stop, as SGLang counts them.
            used = len(ids) if step.ids_used is None else step.ids_used
            through = used if step.ids_through is None else step.ids_through
            sample.generated -= len(ids) - through
            self.usage.per_sample_completion[sample.index] = sample.generated
            if not any(t in self._token_stops for t in ids[:used + 1]):
                self._stopped_early = True  # a text stop: the worker does not know to stop
            if through > used and lp is not None:
                stop_token = ids[used]  # its logprob is reported, as SGLang's own server does
            ids = ids[:used]
        values: list[float] | None = None
        tops: list[TopRow] | None = None
        if lp is not None:
            keep = len(ids) + (stop_token is not None)
            values, tops = _logprob_rows(lp, self._top_n)
            values = values[:keep]
            if tops is not None:
                tops = tops[:keep]
            if len(values) < keep:  # the worker sent no logprob for the stop token
                stop_token = None
        delta = SampleDelta(sample.index, step.text, ids, values, tops, stop_token=stop_token, at=at)
        if step.matched is not None:
            delta.finish_reason = "stop"
            delta.matched_stop = step.matched
            self._close(sample)
            return [delta]
        if over:  # the worker went past what was asked: the sample ends here, the worker is stopped
            delta.text += sample.text.finish().text
            delta.finish_reason = "length"
            self._stopped_early = True
            self._close(sample)
            return [delta]
        return [delta] if (step.text or ids) else []

    def _close(self, sample: _Sample) -> None:
        if not sample.done:
            sample.done = True
            self._open -= 1
            self.usage.completion_tokens = sum(self.usage.per_sample_completion.values())
