"""The interop tests' own tools: the populator and the unknown-field finder.

If these were wrong the round-trip tests could pass without checking anything,
so they get tests of their own.
"""

from __future__ import annotations

import json

from gateway.proto import common_pb2
from gateway.proto import sglang_scheduler_pb2 as pb

from .populate import SET, UNSET, ZERO, Plan, canonical, oneof_choices, populate, unknown_fields


def test_the_same_plan_builds_the_same_bytes() -> None:
    plan = Plan(3, SET, {"sglang.grpc.scheduler.SamplingParams.constraint": "ebnf_grammar"})
    first = populate(pb.GenerateRequest(), plan).SerializeToString(deterministic=True)
    second = populate(pb.GenerateRequest(), plan).SerializeToString(deterministic=True)
    other_seed = populate(pb.GenerateRequest(), Plan(4, SET, plan.choices))
    assert first == second
    assert other_seed.SerializeToString(deterministic=True) != first


def test_a_plan_survives_json() -> None:
    plan = Plan(9, ZERO, {"a.B.c": "d"})
    assert Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan


def test_presence_policies() -> None:
    set_ = populate(pb.SamplingParams(), Plan(1, SET))
    zero = populate(pb.SamplingParams(), Plan(1, ZERO))
    unset = populate(pb.SamplingParams(), Plan(1, UNSET))
    assert set_.HasField("max_new_tokens") and set_.max_new_tokens != 0
    assert zero.HasField("max_new_tokens") and zero.max_new_tokens == 0
    assert zero.WhichOneof("constraint") == "regex" and zero.regex == ""
    assert not unset.HasField("max_new_tokens")
    assert unset.WhichOneof("constraint") is None
    assert len(set_.logit_bias) >= 2 and len(set_.stop_token_ids) >= 2


def test_oneof_choices_cover_the_cross_product_of_reachable_oneofs() -> None:
    combos = list(oneof_choices(pb.GenerateResponse.DESCRIPTOR))
    assert len(combos) == 2 * 2
    combos = list(oneof_choices(common_pb2.KvEventBatch.DESCRIPTOR))
    assert len(combos) == 3 * 4
    assert list(oneof_choices(pb.HealthCheckRequest.DESCRIPTOR)) == [{}]


def test_unknown_fields_are_found_at_any_depth() -> None:
    reply = pb.GetLoadsResponse()
    load = reply.loads.add()
    load.MergeFromString(b"\x98\x06\x01")  # field 99, varint 1: not in SchedulerLoad
    parsed = pb.GetLoadsResponse.FromString(reply.SerializeToString())
    assert unknown_fields(parsed) == [
        "sglang.grpc.scheduler.SchedulerLoad#99 at sglang.grpc.scheduler.GetLoadsResponse.loads[0]"
    ]
    assert unknown_fields(populate(pb.GetLoadsResponse(), Plan(1))) == []


def test_canonical_keeps_proto_names_and_enum_numbers() -> None:
    stored = common_pb2.KvBlocksStored(tier=common_pb2.KV_CACHE_TIER_HOST, parent_block_hash=0)
    assert canonical(stored) == {"tier": 2, "parent_block_hash": "0"}
