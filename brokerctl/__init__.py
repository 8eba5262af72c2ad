"""``brokerctl``: the command line for users, operators and the daemons.

``main`` parses and dispatches; ``render`` turns API objects into tables that fit 100
columns; ``demo`` runs the embedded demo. It talks to the broker only through the SDK
(``brokersdk``); ``serve``/``agent`` import the server or agent lazily, on demand.
"""
