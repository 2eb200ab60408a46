"""The lab beside the gateway: the simulated SGLang worker, the benchmarks and the demo.

It ships in the same distribution but is a separate package so the product never
depends on it: ``gateway`` never imports ``gateway_lab`` (tests/test_layers.py checks
that), while the lab drives the gateway from outside, as an operator would. The
``token-gateway`` command finds the lab's sub-commands through the
``token_gateway.commands`` entry-point group.
"""
