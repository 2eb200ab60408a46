"""What the pipeline reports as it runs, for metrics and logs.

The routing layer calls these hooks at the points only it can see (stage
timings, the policy's decision, retries, a worker stream's end); the server
layer plugs in an implementation that turns them into Prometheus series and
access-log fields. The base class does nothing, so routing works without one.
"""

from __future__ import annotations


class PipelineObserver:
    """No-op hooks; override what you need. Called on the event loop, must not block."""

    def model_resolved(self, model: str) -> None:
        """The request was matched to served model ``model``."""

    def stage(self, name: str, seconds: float) -> None:
        """A pipeline stage took ``seconds`` (template, tokenize, select, first_token, relay)."""

    def selected(self, policy: str, reason: str, worker_id: str) -> None:
        """A policy chose ``worker_id`` for one attempt, for ``reason``."""

    def retried(self, worker_id: str, code: str) -> None:
        """An attempt on ``worker_id`` failed before output with ``code`` and is retried elsewhere."""

    def resumed(self, worker_id: str, outcome: str) -> None:
        """A stream broken on ``worker_id`` after output started was continued elsewhere
        (``outcome`` "ok"), or the continuation could not be opened ("failed")."""

    def worker_done(
        self, model: str, worker_id: str, *, predicted_cached: int, reported_cached: int, success: bool,
        sent_prompt: int = 0, reported_prompt: int = 0, aborted: bool = False,
    ) -> None:
        """A worker's part of a request ended (its lease was released after output).

        ``predicted_cached`` is the policy's guess, ``reported_cached`` the worker's;
        ``sent_prompt`` is the prompt length the gateway tokenized and ``reported_prompt``
        the length the worker counted (0 when it did not say): a mismatch means the
        gateway's tokenizer differs from the worker's. ``aborted``: its client left or
        asked to stop (its own outcome, neither ok nor error)."""

    def generation_done(
        self, model: str, worker_id: str, *, prompt_tokens: int, completion_tokens: int, cached_tokens: int
    ) -> None:
        """A generation's output was relayed; its final token counts."""

    def generation_timing(
        self, model: str, worker_id: str, *, first_token_at: float, last_token_at: float,
        output_tokens: int, token_gaps: list[float],
    ) -> None:
        """When a generation's first and last tokens arrived (``time.perf_counter``) and the
        per-token gap of each later message (for TTFT, TPOT, inter-token latency, e2e)."""


NULL_OBSERVER = PipelineObserver()
