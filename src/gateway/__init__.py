"""token-gateway: a token-level routing gateway for SGLang gRPC workers."""

__version__ = "0.1.0"
