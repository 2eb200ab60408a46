"""The simulated worker's knobs (gateway_lab/sim/config.py): checked at construction, the
step cost model, sampling defaults as JSON, and the flags that rebuild a config in a
spawned worker process."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from gateway.settings import add_options, from_namespace
from gateway_lab.sim.config import SimConfig, config_to_argv


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"page_size": 0}, "page_size"),
        ({"dp_size": 0}, "dp_size"),
        ({"kv_capacity_tokens": 8}, "at least one page"),
        ({"role": "leader"}, "role"),
        ({"eos_probability": 1.5}, "eos_probability"),
        ({"time_scale": -1.0}, "time_scale"),
        ({"fault_fail_share": 2.0}, "fault_fail_share"),
        ({"sampling_defaults": "{oops"}, "not JSON"),
        ({"sampling_defaults": "[1]"}, "JSON object"),
    ],
)
def test_bad_knobs_are_refused(fields: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SimConfig(**fields)  # type: ignore[arg-type]


def test_step_costs_and_the_zero_cost_copy() -> None:
    config = SimConfig(step_base_s=0.001, prefill_token_s=0.0001, decode_seq_s=0.01)
    assert config.step_cost(100, 2) == pytest.approx(0.001 + 0.01 + 0.02)
    zero = config.zero_cost()
    assert zero.step_cost(10_000, 64) == 0.0 and zero.page_size == config.page_size


def test_sampling_defaults_and_the_served_name() -> None:
    config = SimConfig(sampling_defaults='{"temperature": 0.6, "top_k": 20, "note": "x", "top_p": "high"}')
    assert config.sampling_defaults_dict() == {"temperature": 0.6, "top_k": 20}  # known numeric keys only
    assert SimConfig(sampling_defaults="").sampling_defaults_dict() == {}
    assert SimConfig(model="m").served_name == "m" and SimConfig(model="m", served_model_name="s").served_name == "s"


def test_the_flags_rebuild_the_same_config() -> None:
    config = dataclasses.replace(SimConfig(), page_size=8, eos_probability=0.125, scripted_replies=False,
                                 role="prefill", fault_stall_s=0.25, sampling_defaults="")
    parser = argparse.ArgumentParser()
    add_options(parser, SimConfig)
    rebuilt = from_namespace(SimConfig, parser.parse_args(config_to_argv(config)))
    assert rebuilt == config
