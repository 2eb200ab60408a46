"""Generated gRPC stubs (scripts/gen_protos.py). Never edit by hand."""
