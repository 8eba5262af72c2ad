"""``python -m brokerctl`` is the ``brokerctl`` command."""

import sys

from brokerctl.main import main

sys.exit(main())
