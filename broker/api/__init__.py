"""The broker's gRPC servicers: validate every input at the edge, translate wire
messages into job operations (``broker.jobs.ops``) or recovery triggers, and read
through views; they decide nothing about jobs themselves."""
