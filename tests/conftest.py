"""Root pytest configuration: real services are provided by fixture plugins.

Each plugin module starts a real server on a loopback port (redis-server, moto's
S3 HTTP server, the gRPC broker, agent processes) and tears it down.
"""

pytest_plugins = [
    "tests.fixtures.s3_server",
    "tests.fixtures.redis_server",
    "tests.fixtures.redis_sentinel",
    "tests.fixtures.cluster",
    "tests.fixtures.stoppable_s3",
    "tests.fixtures.file_durations",  # per-file and per-directory times in the summary
]


def pytest_configure(config: object) -> None:
    """TLS + auth everywhere: one dev CA per process; the bootstrap operator is the
    default identity of SDK clients and brokerctl subprocesses (tests/fixtures/pki.py)."""
    from tests.fixtures.pki import install

    install()
