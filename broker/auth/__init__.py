"""Authentication and authorization (docs/contracts.md "Authentication and authorization").

identity.py (who: principals, roles, certificate names), policy.py (what each role may
do: the one decision table), tokens.py (users' bearer tokens), audit.py (the mutation
log), interceptor.py (applies all of it to every RPC: the outermost layer of
broker/api/pipeline.py), tls.py (server credentials),
devca.py (a development CA for the demo and tests).
"""
