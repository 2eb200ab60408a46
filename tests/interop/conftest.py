"""Shared fixtures for the wire-contract interop tests."""

from __future__ import annotations

import pytest
from google.protobuf import json_format
from google.protobuf.descriptor_pb2 import FileDescriptorProto

from .official import run_official


@pytest.fixture(scope="session")
def reference_files() -> dict[str, FileDescriptorProto]:
    """The reference (smg-grpc-proto) FileDescriptorProtos, by file name."""
    raw = run_official("describe", {})
    return {
        name: json_format.ParseDict(data, FileDescriptorProto())
        for name, data in raw["files"].items()
    }
