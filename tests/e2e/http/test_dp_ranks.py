"""Data-parallel workers end to end, over gRPC and over SGLang's HTTP API: one endpoint
with N ranks is N routing targets, a shared-prefix workload keeps each prefix on one
rank, and the fleet's hit rate is the one N separate workers reach."""

from __future__ import annotations

import random
from typing import Any

import pytest

from gateway.workers.worker import one_per_engine
from tests.e2e.http.conftest import StackOptions, start_stack

GROUPS, PROMPTS, SYSTEM, QUESTION = 4, 3, 256, 32


def _workload(seed: int = 7) -> list[list[int]]:
    """A small generated-shared-prefix load: each group one system prompt, each prompt its own question, shuffled."""
    rng = random.Random(seed)
    systems = [[rng.randrange(1000, 20000) for _ in range(SYSTEM)] for _ in range(GROUPS)]
    prompts = [s + [rng.randrange(1000, 20000) for _ in range(QUESTION)] for s in systems for _ in range(PROMPTS)]
    rng.shuffle(prompts)
    return prompts


async def _run(engine: str, tmp_path: Any, **opts: Any) -> tuple[float, dict[int, set[tuple[str, int]]], list[Any]]:
    """Send the workload one request at a time; (fleet hit rate, the (worker, rank) each group's
    requests ran on, the gateway's GET /workers)."""
    options = StackOptions(engine=engine, policy="cache_aware", **opts)
    async with start_stack(options, tmp_path) as stack:
        prompts = _workload()
        for ids in prompts:
            await stack.client.completions.create(model=stack.model, prompt=ids, max_tokens=2, temperature=0)
        counters = [w.counters for w in stack.fleet.workers]
        hit = sum(c.cached_tokens for c in counters) / sum(c.prompt_tokens for c in counters)
        group_of = {tuple(ids[:SYSTEM]): g for g, ids in enumerate({tuple(p[:SYSTEM]): p for p in prompts}.values())}
        landed: dict[int, set[tuple[str, int]]] = {}
        for w in stack.fleet.workers:
            for req in w.received:
                ids = list(req.tokenized.input_ids)
                landed.setdefault(group_of[tuple(ids[:SYSTEM])], set()).add((w.url, req.data_parallel_rank))
        listed = (await stack.http.get("/workers")).json()["workers"]
        assert len(one_per_engine(stack.state.registry.all())) == len(stack.fleet.workers)
        return hit, landed, listed


@pytest.mark.parametrize("engine", ["sglang", "sglang-http"])
async def test_a_shared_prefix_stays_on_its_rank_and_ranks_hit_like_separate_workers(engine: str, tmp_path: Any) -> None:
    ranked_hit, landed, listed = await _run(engine, tmp_path / "dp", workers=1, sim={"dp_size": 4})
    plain_hit, plain_landed, _ = await _run(engine, tmp_path / "plain", workers=4)
    assert sorted(w["id"].rsplit("@", 1)[1] for w in listed) == ["0", "1", "2", "3"]
    assert {(w["engine_id"], w["dp_size"]) for w in listed} == {(listed[0]["engine_id"], 4)}
    assert all(len(where) == 1 for where in landed.values())  # every group's requests on one rank
    assert len({where for group in landed.values() for where in group}) > 1  # the groups spread over the ranks
    assert all(len(where) == 1 for where in plain_landed.values())
    # the first request of a group misses, the others reuse its system prompt (whole pages of 16)
    ideal = (PROMPTS - 1) * SYSTEM / (PROMPTS * (SYSTEM + QUESTION))
    assert ranked_hit == pytest.approx(plain_hit) == pytest.approx(ideal)
