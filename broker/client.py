"""Old import path of the SDK, kept for one release: use ``brokersdk`` instead.

The SDK moved to its own package so that it depends only on the API stubs, never on
the server (``from broker.client import BrokerClient`` keeps working meanwhile).
"""

from brokersdk.client import *  # noqa: F403
from brokersdk.client import __all__  # noqa: F401
