"""Old module path of the CLI, kept for one release: the CLI is the ``brokerctl`` package.

``python -m broker.cli`` keeps working meanwhile (scripts and process managers that
used it); the console script ``brokerctl`` points at ``brokerctl.main:main``.
"""

import sys

from brokerctl.main import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
