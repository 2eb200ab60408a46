"""policies layer (see DESIGN.md): pure, synchronous routing decisions over token ids.

``make_policy(PolicyConfig(...))`` builds a policy by name (``POLICY_NAMES``);
``explain(policy, request, workers)`` says what it would do and why.
"""

from gateway.policies.base import (
    Decision,
    LoadSnapshot,
    NoWorkerAvailable,
    Policy,
    RouteRequest,
    WorkerView,
)
from gateway.policies.factory import POLICY_NAMES, PolicyConfig, close_policy, explain, make_policy

__all__ = [
    "POLICY_NAMES",
    "Decision",
    "LoadSnapshot",
    "NoWorkerAvailable",
    "Policy",
    "PolicyConfig",
    "RouteRequest",
    "WorkerView",
    "close_policy",
    "explain",
    "make_policy",
]
