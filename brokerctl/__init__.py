"""``brokerctl``: the command line for users, operators and the daemons.

``main`` parses and dispatches; ``render`` turns API objects into tables that fit 100
columns; ``demo`` runs the embedded demo. It talks to the broker only through the SDK
(``brokersdk``); ``serve``/``agent`` import the server or agent lazily, on demand.
"""

import os as _os
import sys as _sys

# gRPC's C core prints its own log lines (a failed TLS handshake, a refused connect) on
# stderr before the CLI can say what went wrong in one line. It reads GRPC_VERBOSITY
# once, when grpc is imported, so it is set here, before anything imports grpc; the
# daemons (serve, agent, demo, console) keep gRPC's errors. An explicit setting wins.
_DAEMONS = {"serve", "agent", "demo", "console"}
if not _DAEMONS & set(_sys.argv[1:]):
    _os.environ.setdefault("GRPC_VERBOSITY", "NONE")
