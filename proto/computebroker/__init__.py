"""Generated gRPC API of Compute Broker (see scripts/gen_proto.py)."""
