"""Workdirs: users' code, content-addressed (blob store, gRPC service, submit checks).

Why a package of its own: the bytes of a job's working directory have nothing to do
with scheduling; keeping them here leaves the job core and the servicers with one
hook each (docs/contracts.md "Workdirs").
"""
