"""The Compute Broker web console (`brokerctl console`): fleet, queues, jobs, migrations, plans.

Why a separate package: the console is a *client* of the broker's gRPC API through the SDK
(``brokersdk``), exactly like ``brokerctl``; it never reads the broker's store. So the
credentials and roles of the API apply to every page and action, and the console can run
anywhere a user could run the CLI. Modules by job:

* ``identity``  - who the signed-in user is, and ``client_for(session)``: the SDK client
                  carrying that user's credential (the seam for the broker's auth);
* ``sessions``  - server-side sessions behind an HttpOnly, SameSite=strict cookie, and CSRF;
* ``fleet``, ``queue``, ``jobview``, ``plans`` - view models: protobufs in, plain data out;
* ``live``      - server-sent events fed by the broker's WatchJob stream (and by polling for
                  the fleet-wide pages, which have no watch stream);
* ``app``       - the Starlette routes; ``server`` runs it under uvicorn.
"""
