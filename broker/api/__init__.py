"""The broker's gRPC servicers: translate wire messages into calls on the job core, and
validate every input at the edge."""
