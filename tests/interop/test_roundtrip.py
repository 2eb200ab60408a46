"""Value-level interop: every message we declare, fully populated, both directions.

For each message type in our sglang_scheduler.proto and common.proto (which is
every message the gateway sends or receives, nested ones included), and for
every combination of oneof members reachable from it, we build instances with
the descriptor-driven populator under three presence policies (all set, present
but zero, absent) plus the empty message, and one instance per enum value for
every enum field. Then, in one official-side subprocess run:

- ours serialize -> official parse: same content, no unknown fields;
- official re-serialize -> ours parse: same content, identical bytes;
- official populate (same plan, official classes) -> ours parse: same content,
  identical deterministic bytes, no unknown fields.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from .contract import ACCEPTED_OMISSIONS, OUR_MODULES
from .official import run_official
from .populate import (
    PRESENCE_POLICIES,
    SET,
    UNSET,
    Plan,
    canonical,
    oneof_choices,
    populate,
    real_oneofs,
    unknown_fields,
)


@dataclass(frozen=True)
class Case:
    id: str
    descriptor: Descriptor
    plan: Plan | None  # None: built by hand (empty or single enum), not by the populator
    message: Message

    @property
    def payload(self) -> bytes:
        return self.message.SerializeToString(deterministic=True)


def _our_message_types() -> list[Descriptor]:
    found = []
    for module in OUR_MODULES:
        found += [
            module.DESCRIPTOR.message_types_by_name[name]
            for name in sorted(module.DESCRIPTOR.message_types_by_name)
        ]
    return found


def _new(descriptor: Descriptor) -> Message:
    return message_factory.GetMessageClass(descriptor)()


def _choice_label(choices: dict[str, str]) -> str:
    return ",".join(
        f"{name.rsplit('.', 1)[-1]}={member}" for name, member in sorted(choices.items())
    )


def _build_cases() -> list[Case]:
    cases: list[Case] = []
    seed = 0
    for descriptor in _our_message_types():
        short = descriptor.full_name
        cases.append(Case(f"{short}/empty", descriptor, None, _new(descriptor)))
        for choices in oneof_choices(descriptor):
            for presence in PRESENCE_POLICIES:
                if presence == UNSET and choices != next(oneof_choices(descriptor)):
                    continue  # absent oneofs make every combination the same message
                seed += 1
                plan = Plan(seed, presence, choices, ACCEPTED_OMISSIONS)
                label = _choice_label(choices) if presence != UNSET else ""
                case_id = f"{short}/{presence}" + (f"/{label}" if label else "")
                cases.append(Case(case_id, descriptor, plan, populate(_new(descriptor), plan)))
        for fd in descriptor.fields:
            if fd.enum_type is None:
                continue
            for value in fd.enum_type.values:
                message = _new(descriptor)
                if fd.is_repeated:
                    getattr(message, fd.name).append(value.number)
                else:
                    setattr(message, fd.name, value.number)
                cases.append(Case(f"{short}/{fd.name}={value.name}", descriptor, None, message))
    return cases


CASES = _build_cases()
CASE_IDS = [case.id for case in CASES]
BY_ID = {case.id: case for case in CASES}


@pytest.fixture(scope="module")
def official_results() -> dict[str, dict[str, Any]]:
    """One subprocess run answers every case (starting it per case would cost seconds)."""
    payload = {
        "cases": [
            {
                "id": case.id,
                "type": case.descriptor.full_name,
                "payload": base64.b64encode(case.payload).decode(),
                "plan": case.plan.to_json() if case.plan else None,
            }
            for case in CASES
        ]
    }
    return run_official("roundtrip", payload)["results"]


def _unexplained(entries: list[str]) -> list[str]:
    """Unknown-field entries ("<type>#<number> at <path>") that ACCEPTED_OMISSIONS does not list."""
    left = []
    for entry in entries:
        message_type, number = entry.split(" at ", 1)[0].rsplit("#", 1)
        if int(number) not in ACCEPTED_OMISSIONS.get(message_type, frozenset()):
            left.append(entry)
    return left


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_official_parses_what_we_send(case_id: str, official_results: dict[str, Any]) -> None:
    case, result = BY_ID[case_id], official_results[case_id]
    assert result["unknown"] == [], "the official classes saw fields they do not know"
    assert result["parsed"] == canonical(case.message)


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_we_parse_what_official_reserializes(
    case_id: str, official_results: dict[str, Any]
) -> None:
    case, result = BY_ID[case_id], official_results[case_id]
    data = base64.b64decode(result["reserialized"])
    assert data == case.payload, "official re-serialization is not byte-identical to ours"
    parsed = _new(case.descriptor)
    parsed.ParseFromString(data)
    assert unknown_fields(parsed) == []
    assert canonical(parsed) == canonical(case.message)


@pytest.mark.parametrize("case_id", [case.id for case in CASES if case.plan is not None])
def test_we_parse_what_official_builds(case_id: str, official_results: dict[str, Any]) -> None:
    case, result = BY_ID[case_id], official_results[case_id]
    data = base64.b64decode(result["built"])
    parsed = _new(case.descriptor)
    parsed.ParseFromString(data)
    assert _unexplained(unknown_fields(parsed)) == [], "the reference sent fields we do not declare"
    assert result["built_canonical"] == canonical(case.message)
    assert canonical(parsed) == canonical(case.message)
    assert data == case.payload, "official and ours serialize the same content differently"


def _present_fields(message: Message, into: set[tuple[str, str]]) -> None:
    for fd, value in message.ListFields():
        into.add((message.DESCRIPTOR.full_name, fd.name))
        if fd.message_type is None or fd.message_type.full_name.startswith("google.protobuf."):
            continue
        if fd.is_repeated and fd.message_type.GetOptions().map_entry:
            items = value.values() if fd.message_type.fields_by_name["value"].message_type else []
        elif fd.is_repeated:
            items = value
        else:
            items = [value]
        for item in items:
            _present_fields(item, into)


def _declared_fields(descriptor: Descriptor, into: set[tuple[str, str]]) -> None:
    if descriptor.full_name.startswith("google.protobuf.") or descriptor.GetOptions().map_entry:
        return
    for fd in descriptor.fields:
        into.add((descriptor.full_name, fd.name))


def test_the_cases_set_every_field_of_every_message_somewhere() -> None:
    """The populator reached every field and every oneof member (no silent gaps)."""
    declared: set[tuple[str, str]] = set()
    present: set[tuple[str, str]] = set()
    for descriptor in _our_message_types():
        _declared_fields(descriptor, declared)
    for case in CASES:
        _present_fields(case.message, present)
    assert declared - present == set()


def test_a_set_case_holds_every_non_oneof_field() -> None:
    """Within one fully set instance, every field outside a real oneof is present."""
    for case in CASES:
        if case.plan is None or case.plan.presence != SET:
            continue
        in_oneof = {fd.name for oneof in real_oneofs(case.descriptor) for fd in oneof.fields}
        present = {fd.name for fd, _ in case.message.ListFields()}
        expected = {fd.name for fd in case.descriptor.fields if fd.name not in in_oneof}
        assert expected <= present, f"{case.id}: unset {expected - present}"
        assert len(in_oneof & present) == len(real_oneofs(case.descriptor))


def test_cases_cover_the_variants_the_gateway_depends_on() -> None:
    """Spot checks that the generic cases include the specific shapes named in the contract."""
    ids = set(CASE_IDS)
    scheduler = "sglang.grpc.scheduler"
    for member in ("regex", "json_schema", "ebnf_grammar", "structural_tag"):
        assert f"{scheduler}.GenerateRequest/set/constraint={member}" in ids
    for stop in ("matched_token_id", "matched_stop_str"):
        assert f"{scheduler}.GenerateResponse/set/matched_stop={stop},response=complete" in ids
        assert f"{scheduler}.GenerateResponse/zero/matched_stop={stop},response=complete" in ids
    for kind in ("stored", "removed", "cleared"):
        for key in ("text", "blob", "number", "multimodal"):
            assert f"smg.grpc.common.KvEventBatch/set/key={key},data={kind}" in ids
    input_logprob = BY_ID[f"{scheduler}.InputLogProbs/set"].message
    values = [entry.HasField("value") for entry in input_logprob.token_logprobs]  # type: ignore[attr-defined]
    assert values == [False, True, True], "logprob entries without and with a value"


def _enum_fields() -> list[FieldDescriptor]:
    found = []
    for descriptor in _our_message_types():
        found += [fd for fd in descriptor.fields if fd.enum_type is not None]
    return found


def test_every_enum_value_has_a_case() -> None:
    fields = _enum_fields()
    assert fields, "no enum fields found"
    for fd in fields:
        for value in fd.enum_type.values:
            assert f"{fd.containing_type.full_name}/{fd.name}={value.name}" in BY_ID
