"""The pipeline's hooks (pipeline/observer.py): the base does nothing so routing works
without an observer, and a subclass overrides only the hooks it needs."""

from __future__ import annotations

import inspect

from gateway.pipeline.observer import NULL_OBSERVER, PipelineObserver

HOOKS = {
    "model_resolved", "stage", "selected", "retried", "resumed", "worker_done", "generation_done", "generation_timing",
}


def _call_every_hook(observer: PipelineObserver) -> list[object]:
    """Each hook called the way the pipeline calls it (keywords as in lease.py and generation.py)."""
    return [
        observer.model_resolved("m"),
        observer.stage("tokenize", 0.01),
        observer.selected("cache_aware", "prefix", "w1"),
        observer.retried("w1", "UNAVAILABLE"),
        observer.resumed("w1", "ok"),
        observer.worker_done("m", "w1", predicted_cached=3, reported_cached=2, success=True,
                             sent_prompt=10, reported_prompt=10, aborted=False),
        observer.worker_done("m", "w1", predicted_cached=0, reported_cached=0, success=False),
        observer.generation_done("m", "w1", prompt_tokens=10, completion_tokens=4, cached_tokens=2),
        observer.generation_timing("m", "w1", first_token_at=1.0, last_token_at=2.0, output_tokens=4, token_gaps=[0.1]),
    ]


def test_the_null_observer_takes_every_hook_and_does_nothing() -> None:
    assert isinstance(NULL_OBSERVER, PipelineObserver)
    assert _call_every_hook(NULL_OBSERVER) == [None] * 9
    public = {name for name, _ in inspect.getmembers(PipelineObserver, inspect.isfunction) if not name.startswith("_")}
    assert public == HOOKS  # a new hook is added here, with the call the pipeline makes


def test_a_subclass_overrides_one_hook_and_inherits_the_rest() -> None:
    class Stages(PipelineObserver):
        def __init__(self) -> None:
            self.seen: list[tuple[str, float]] = []

        def stage(self, name: str, seconds: float) -> None:
            self.seen.append((name, seconds))

    observer = Stages()
    _call_every_hook(observer)
    assert observer.seen == [("tokenize", 0.01)]


def test_worker_done_keeps_the_later_fields_optional() -> None:
    """Observers written before ``sent_prompt``/``reported_prompt``/``aborted`` existed are
    called without them: those keywords must keep their defaults."""
    params = inspect.signature(PipelineObserver.worker_done).parameters
    assert {name: params[name].default for name in ("sent_prompt", "reported_prompt", "aborted")} == {
        "sent_prompt": 0, "reported_prompt": 0, "aborted": False,
    }
    assert all(params[n].kind is inspect.Parameter.KEYWORD_ONLY for n in ("predicted_cached", "reported_cached", "success"))
