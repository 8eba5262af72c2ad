"""Root pytest configuration: real services are provided by fixture plugins.

Each plugin module starts a real server on a loopback port (redis-server, moto's
S3 HTTP server, the gRPC broker, agent processes) and tears it down.
"""

pytest_plugins = [
    "tests.fixtures.s3_server",
    "tests.fixtures.redis_server",
    "tests.fixtures.cluster",
]
