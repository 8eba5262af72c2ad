"""The central Compute Broker: gRPC API, job lifecycle, scheduler loop, state."""
