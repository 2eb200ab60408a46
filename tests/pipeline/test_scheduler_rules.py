"""The pass-through's rule set (pipeline/scheduler_rules.py): a raw SGLang GenerateRequest
is held to /generate's rules, refused fields are named with their reason, stripped fields
are cleared, and what is forwarded has n and max_new_tokens settled."""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache

import pytest

from gateway.pipeline.catalog import ModelEntry
from gateway.pipeline.engine import Engine
from gateway.pipeline.router import Router
from gateway.pipeline.scheduler_rules import FORBIDDEN, STRIPPED, check_scheduler_generate
from gateway.pipeline.tenancy import SALT_TOKENS
from gateway.policies.factory import make_policy
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.protocol.errors import InvalidRequestError
from gateway.tokenization import ChatPromptCache, Tokenizer
from gateway.workers.registry import WorkerRegistry
from tests.tokenization.helpers import qwen_files


@cache
def _qwen() -> Tokenizer:
    return Tokenizer.from_path(qwen_files())


class _Catalog:
    def __init__(self, entry: ModelEntry) -> None:
        self.entry = entry

    def get(self, name: str | None) -> ModelEntry:
        return self.entry

    def worker_model(self, name: str) -> str:
        return name


@pytest.fixture
def setup() -> Iterator[tuple[Engine, ModelEntry]]:
    tok = _qwen()
    entry = ModelEntry("m", tok, "path", 100, ChatPromptCache(tok))
    engine = Engine(Router(WorkerRegistry(), lambda role: make_policy()), _Catalog(entry))  # type: ignore[arg-type]
    try:
        yield engine, entry
    finally:
        engine.close()


def _request(**sampling: object) -> pb.GenerateRequest:
    req = pb.GenerateRequest(request_id="r1", tokenized=pb.TokenizedInput(input_ids=[10, 11, 12]), stream=True)
    for name, value in sampling.items():
        setattr(req.sampling_params, name, value)
    return req


def test_a_plain_request_is_forwarded_with_its_limits_settled(setup: tuple[Engine, ModelEntry]) -> None:
    engine, entry = setup
    out, prepared = check_scheduler_generate(engine, entry, _request(temperature=0.5, max_new_tokens=8))
    assert out.sampling_params.max_new_tokens == 8 and out.sampling_params.n == 1
    assert list(out.tokenized.input_ids) == [10, 11, 12] and out.request_id == "r1"
    assert prepared.prompt_ids == [10, 11, 12] and prepared.stream and prepared.sampling.temperature == 0.5


def test_an_unset_max_new_tokens_becomes_what_the_context_leaves(setup: tuple[Engine, ModelEntry]) -> None:
    engine, entry = setup
    out, _ = check_scheduler_generate(engine, entry, _request())
    assert out.sampling_params.max_new_tokens == 100 - 3 - 1  # not /generate's default of 128


@pytest.mark.parametrize("field", sorted(FORBIDDEN))
def test_forbidden_fields_are_refused_with_their_reason(setup: tuple[Engine, ModelEntry], field: str) -> None:
    engine, entry = setup
    req = _request(max_new_tokens=4)
    if field == "custom_logit_processor":
        req.custom_logit_processor = "serialized"
    elif field == "input_embeds":
        req.input_embeds.append(0.5)
    elif field == "disaggregated_params":
        req.disaggregated_params.bootstrap_host = "10.0.0.1"
    else:
        req.mm_inputs.SetInParent()
    with pytest.raises(InvalidRequestError, match=field) as err:
        check_scheduler_generate(engine, entry, req)
    assert err.value.param == field and FORBIDDEN[field] in err.value.message


def test_stripped_fields_are_cleared_before_forwarding(setup: tuple[Engine, ModelEntry]) -> None:
    engine, entry = setup
    req = _request(max_new_tokens=4)
    req.return_hidden_states = True
    req.data_parallel_rank = 3
    req.log_metrics = True
    out, _ = check_scheduler_generate(engine, entry, req)
    assert set(STRIPPED) == {"return_hidden_states", "data_parallel_rank", "log_metrics"}
    assert (out.return_hidden_states, out.data_parallel_rank, out.log_metrics) == (False, 0, False)
    assert req.data_parallel_rank == 3  # the client's message is not edited in place


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda r: r.tokenized.ClearField("input_ids"), "input_ids is empty"),
        (lambda r: r.token_ids_logprob.append(10**7), "token_ids_logprob must be in"),
        (lambda r: setattr(r.sampling_params, "temperature", -1.0), "temperature"),
        (lambda r: setattr(r.sampling_params, "stream_interval", 0), "stream_interval"),
        (lambda r: r.sampling_params.custom_params.update({"my_processor_arg": 1}), "only 'seed'"),
        (lambda r: r.sampling_params.custom_params.update({"seed": 1.5}), "seed must be an integer"),
        (lambda r: r.tokenized.input_ids.append(10**7), "token ids must be in"),
    ],
)
def test_requests_that_break_the_rules_are_refused(setup: tuple[Engine, ModelEntry], edit: object, match: str) -> None:
    engine, entry = setup
    req = _request(max_new_tokens=4)
    edit(req)  # type: ignore[operator]
    with pytest.raises(InvalidRequestError, match=match):
        check_scheduler_generate(engine, entry, req)


def test_an_integer_seed_is_relayed_and_validated(setup: tuple[Engine, ModelEntry]) -> None:
    engine, entry = setup
    req = _request(max_new_tokens=4)
    req.sampling_params.custom_params.update({"seed": 7})
    out, prepared = check_scheduler_generate(engine, entry, req)
    assert prepared.sampling.seed == 7 and out.sampling_params.custom_params.fields["seed"].number_value == 7


def test_a_salted_request_forwards_the_salted_prompt(setup: tuple[Engine, ModelEntry]) -> None:
    engine, entry = setup
    out, prepared = check_scheduler_generate(engine, entry, _request(max_new_tokens=4), cache_salt="tenant")
    assert list(out.tokenized.input_ids) == prepared.prompt_ids
    assert len(prepared.prompt_ids) == 3 + SALT_TOKENS and prepared.prompt_ids[-3:] == [10, 11, 12]
