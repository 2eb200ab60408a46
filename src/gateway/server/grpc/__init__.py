"""the gRPC front door: the gateway API, the SglangScheduler pass-through, health, reflection (see DESIGN.md)."""
