from __future__ import annotations

import dataclasses

import pytest

from gateway.policies.base import LoadSnapshot, WorkerView, build_load_snapshot, build_worker_view
from gateway.protocol.frozen import slots_builder


def test_a_builder_makes_what_the_constructor_makes_and_it_stays_frozen() -> None:
    loads = LoadSnapshot(1, 2, 3, 4, 0.5, 6, 0.7, 0.1)
    assert build_load_snapshot(1, 2, 3, 4, 0.5, 6, 0.7, 0.1) == loads
    assert loads.aged(0.3) == dataclasses.replace(loads, age_s=0.3) and type(loads.aged(0.3)) is LoadSnapshot
    values = ("w0", "grpc://w0", "prefill", False, 3, 100, 40, 7, loads, 4096, 16, 8, 9000, 512)
    view = build_worker_view(*values)
    assert view == WorkerView(*values) and hash(view) == hash(WorkerView(*values))
    assert repr(view) == repr(WorkerView(*values))
    assert [getattr(view, f.name) for f in dataclasses.fields(WorkerView)] == list(values)
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.in_flight = 4  # type: ignore[misc]
    with pytest.raises(TypeError):
        build_worker_view(*values[:-1])  # every field, always: a new field fails loudly


def test_only_frozen_slotted_dataclasses_without_post_init_get_a_builder() -> None:
    @dataclasses.dataclass(slots=True)
    class Mutable:
        a: int

    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        a: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class Checked:
        a: int

        def __post_init__(self) -> None:
            assert self.a >= 0

    for cls in (Mutable, NoSlots, Checked, int):
        with pytest.raises(TypeError):
            slots_builder(cls)


def test_chat_sampling_options_equal_the_constructor_s() -> None:
    from gateway.protocol.chat import ChatCompletionRequest
    from gateway.protocol.sampling import Constraint, SamplingOptions, sampling_from_chat

    req = ChatCompletionRequest.model_validate({
        "messages": [{"role": "user", "content": "x"}], "max_tokens": 9, "temperature": 0.5, "top_k": 0,
        "stop": ["a", "b"], "stop_token_ids": [3], "seed": 4, "logprobs": True, "top_logprobs": 2, "n": 2,
        "logit_bias": {"5": 1.5}, "regex": "[ab]+", "ignore_eos": True,
    })
    got = sampling_from_chat(req, {"top_p": 0.8, "top_k": 20})
    want = SamplingOptions(
        temperature=0.5, top_p=0.8, top_k=-1, max_new_tokens=9, stop=("a", "b"), stop_token_ids=(3,), ignore_eos=True,
        n=2, seed=4, logprobs=True, top_logprobs=2, constraint=Constraint("regex", "[ab]+"), logit_bias={"5": 1.5},
        unset=frozenset({"min_p", "repetition_penalty"}),
    )
    assert got == want and type(got) is SamplingOptions
    plain = sampling_from_chat(ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "x"}]}))
    assert plain == SamplingOptions(unset=frozenset({"temperature", "top_p", "top_k", "min_p", "repetition_penalty"}))


def test_the_route_decision_and_selection_builders_match_their_constructors() -> None:
    from gateway.pipeline.router import Selection, _build_selection
    from gateway.policies.base import Decision, RouteRequest, build_decision, build_route_request

    route = RouteRequest([1, 2, 3], "m", "regular", "r1", "key", None, 8, frozenset())
    assert build_route_request([1, 2, 3], "m", "regular", "r1", "key", None, 8, frozenset()) == route
    assert RouteRequest([1, 2, 3], model="m", request_id="r1", routing_key="key", max_new_tokens=8) == route
    decision = build_decision("w0", "cache_hit", 16, {"w0": 1.5})
    assert decision == Decision("w0", "cache_hit", 16, {"w0": 1.5})
    worker, policy = object(), object()
    built = _build_selection(worker, decision, policy, "regular", b"\x01", None)
    assert built == Selection(worker, decision, policy, "regular", b"\x01", None)  # type: ignore[arg-type]
