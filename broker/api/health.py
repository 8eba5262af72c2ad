"""Probes: the standard gRPC health service, and reflection only when asked for.

Why the standard service (grpc.health.v1): Kubernetes' gRPC probes, grpc_health_probe
and load balancers speak it; a custom "ping" RPC would need a custom probe. The overall
status ("") is SERVING while the process serves; NOT_SERVING during shutdown. A standby
replica is SERVING too (it answers, naming the leader); readiness for writes is the
leader lease, not the probe. Reflection exposes the whole API surface to anyone who
connects, so it is off unless ``BrokerConfig.reflection`` is set.
"""

from __future__ import annotations

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from broker.api.pipeline import LayeredServer
from computebroker.v1 import agent_pb2, capacity_pb2, jobs_pb2, workdir_pb2

SERVICES = [m.DESCRIPTOR.services_by_name[n].full_name for m, n in (
    (jobs_pb2, "JobService"), (capacity_pb2, "CapacityService"),
    (agent_pb2, "AgentService"), (workdir_pb2, "WorkdirService"))]


def add_probes(server: grpc.Server | LayeredServer, *, reflection: bool = False) -> health.HealthServicer:
    """Register health (every service SERVING) and, if asked, reflection on ``server``."""
    servicer = health.HealthServicer()
    for name in ["", *SERVICES]:
        servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    if reflection:
        from grpc_reflection.v1alpha import reflection as refl

        refl.enable_server_reflection([*SERVICES, health.SERVICE_NAME, refl.SERVICE_NAME], server)
    return servicer
