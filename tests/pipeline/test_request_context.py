"""Per-request facts from the front door (pipeline/request_context.py): admission reserved
once per batch, the worker-side ids of a batch, and the response id."""

from __future__ import annotations

from gateway.pipeline.request_context import RequestContext


async def test_a_deferred_admission_is_taken_once_for_the_whole_batch() -> None:
    taken: list[int] = []

    async def admit(prompts: int) -> None:
        taken.append(prompts)

    ctx = RequestContext(admit=admit)
    await ctx.reserve(3)
    await ctx.reserve(3)  # a second call (a retry, a later stage) takes nothing more
    assert taken == [3] and ctx.admit is None


async def test_without_a_deferred_admission_reserve_does_nothing() -> None:
    ctx = RequestContext()
    await ctx.reserve(5)
    assert ctx.admit is None


def test_ids_of_a_batch_and_of_the_response() -> None:
    ctx = RequestContext(request_id="abc")
    assert [ctx.sub_id(i) for i in range(3)] == ["abc", "abc-1", "abc-2"]  # prompt 0 keeps the request's id
    assert ctx.response_id("chatcmpl") == "chatcmpl-abc"


def test_each_context_gets_a_fresh_random_id_and_its_own_worker_list() -> None:
    a, b = RequestContext(), RequestContext()
    assert a.request_id != b.request_id and len(a.request_id) == 32
    int(a.request_id, 16)
    a.worker_ids.append("w1")
    assert b.worker_ids == []


def test_the_admission_hook_is_not_part_of_equality_or_repr() -> None:
    async def admit(prompts: int) -> None:
        return None

    assert RequestContext(request_id="x", admit=admit) == RequestContext(request_id="x")
    assert "admit" not in repr(RequestContext(request_id="x", admit=admit))
