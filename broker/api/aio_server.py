"""The API workers' public server on ``grpc.aio``: SubmitJob on the event loop, every
other method on a thread pool behind the same call pipeline.

Why: on the synchronous server each SubmitJob crossed threads several times (gRPC's
poller to a pool thread, the pool thread to the group commit's leader and back), and
every crossing under 16 callers is a futex wake-up and a GIL switch: about half of the
broker's CPU per submit was the kernel switching threads (broker/server.py). Here a
submit is read, authenticated (from the token cache), checked and answered on the
loop's one thread; its store write joins the group commit through the writer's own
thread (``GroupWriter.submit_soon``), and the whole group's answers come back to the
loop in one wake-up. Nothing on that path blocks the loop: a token cache miss, a spec
whose checks read a store (workdir, checkpoint prefixes, resume source), a refusal (its
retry on a fresh view, the request-id lookup) and an audit record written on its own
all run on the pool (:class:`AsyncSubmit`).

Every other method (job reads, WatchJob, workdir transfers, forwarded calls, health,
reflection) keeps its synchronous code and the same layers (auth, edge, standby gate,
composed once by :class:`~broker.api.pipeline.LayeredServer`): :class:`OnPool` runs
each on the pool with a context that behaves as the synchronous server's
(:class:`PoolContext`: ``abort`` raises, ``is_active``, ``cancel``, ``add_callback``),
which gRPC's own sync-handler support on an aio server does not give (no
``is_active``/``cancel``, and ``add_callback`` never fires in grpc 1.85).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent import futures
from typing import Any

import grpc

from broker.api.edge import Refused
from broker.api.errors import (
    RETRY_PUSHBACK_KEY,
    RETRY_PUSHBACK_MS,
    BrokerError,
    InvalidArgument,
    to_status,
)
from broker.api.jobs_service import visible
from broker.api.pipeline import MethodTable
from broker.auth.audit import AuditLog, PendingAudit, target_of
from broker.auth.identity import Principal
from broker.auth.interceptor import AuthedContext, Authenticator
from broker.auth.policy import METHODS, Permission, PermissionDenied, Unauthenticated, authorize
from broker.auth.tokens import TokenError
from broker.ids import new_job_id
from broker.jobs import transitions
from broker.jobs.applier import Applier
from broker.store.base import AlreadyExists
from broker.store.group_commit import LoopSink
from computebroker.v1 import common_pb2 as pb
from computebroker.v1 import jobs_pb2 as jpb

log = logging.getLogger(__name__)

SUBMIT_METHOD = "/computebroker.v1.JobService/SubmitJob"
_END = object()


# ---- every other method: its synchronous code on the pool ------------------------------
class PoolAbort(Exception):  # noqa: N818 - what grpc's own abort raises is an Exception too
    """A servicer on the pool aborted its call: the status its coroutine sends."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, details)
        self.code, self.details = code, details


class PoolContext:
    """What a synchronous servicer expects of its context, over an aio context, for code
    running on a pool thread: ``abort`` raises there (the status is sent on the loop),
    ``is_active``/``add_callback`` follow the RPC's end, ``cancel`` ends it (the idle
    watch of request streams calls it from its own thread)."""

    def __init__(self, ctx: grpc.aio.ServicerContext, loop: asyncio.AbstractEventLoop) -> None:
        self._ctx = ctx
        self._loop = loop
        self._done = False
        self._callbacks: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        ctx.add_done_callback(self._finished)

    def _finished(self, _ctx: object = None) -> None:
        with self._lock:
            self._done = True
            callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            try:
                cb()
            except Exception:  # noqa: BLE001 - one callback's failure must not skip the rest
                log.exception("an RPC's end callback failed")

    def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        """Raise (as the synchronous server's abort does, with an Exception): the
        handler's coroutine sends the status when the exception reaches it, without a
        round trip to the loop from here."""
        raise PoolAbort(code, details)

    def cancel(self) -> None:
        """End the RPC from any thread (the idle watch's): the status is sent on the loop."""
        # AbortError (the status is sent) or the RPC has already ended
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._ctx.abort(
                grpc.StatusCode.CANCELLED, "the request stream was cancelled by the server"),
                self._loop).result()

    def is_active(self) -> bool:
        return not self._done

    def add_callback(self, callback: Callable[[], None]) -> bool:
        with self._lock:
            if not self._done:
                self._callbacks.append(callback)
                return True
        return False

    def __getattr__(self, name: str) -> Any:  # peer, metadata, auth_context, set_code, ...
        return getattr(self._ctx, name)


class OnPool:
    """Turns a method's synchronous (already layered) handler into a handler of the aio
    server that runs it on ``pool``: unary calls as one task each, response streams one
    message per pool step, request streams read from the loop on demand."""

    def __init__(self, pool: futures.ThreadPoolExecutor) -> None:
        self.pool = pool

    def handler(self, h: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        kw = {"request_deserializer": h.request_deserializer,
              "response_serializer": h.response_serializer}
        if h.request_streaming and h.response_streaming:
            return grpc.stream_stream_rpc_method_handler(self._stream(h.stream_stream, True), **kw)
        if h.request_streaming:
            return grpc.stream_unary_rpc_method_handler(self._unary(h.stream_unary, True), **kw)
        if h.response_streaming:
            return grpc.unary_stream_rpc_method_handler(self._stream(h.unary_stream, False), **kw)
        return grpc.unary_unary_rpc_method_handler(self._unary(h.unary_unary, False), **kw)

    @staticmethod
    def _requests(requests: AsyncIterator[Any], loop: asyncio.AbstractEventLoop) -> Iterator[Any]:
        async def step() -> Any:
            try:
                return await requests.__anext__()
            except StopAsyncIteration:
                return _END

        while True:
            msg = asyncio.run_coroutine_threadsafe(step(), loop).result()
            if msg is _END:
                return
            yield msg

    def _unary(self, behavior: Callable[..., Any], streaming_in: bool) -> Callable[..., Any]:
        pool = self.pool

        async def call(request: Any, ctx: grpc.aio.ServicerContext) -> Any:
            loop = asyncio.get_running_loop()
            if streaming_in:
                request = self._requests(request, loop)
            try:
                return await loop.run_in_executor(pool, behavior, request, PoolContext(ctx, loop))
            except PoolAbort as e:
                await ctx.abort(e.code, e.details)


        return call

    def _stream(self, behavior: Callable[..., Iterator[Any]], streaming_in: bool) -> Callable[..., Any]:
        pool = self.pool

        async def call(request: Any, ctx: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            loop = asyncio.get_running_loop()
            if streaming_in:
                request = self._requests(request, loop)
            gen = behavior(request, PoolContext(ctx, loop))
            step: futures.Future | None = None
            try:
                while True:
                    step = pool.submit(next, gen, _END)
                    try:
                        msg = await asyncio.wrap_future(step)
                    except PoolAbort as e:
                        step = None
                        await ctx.abort(e.code, e.details)
                    step = None
                    if msg is _END:
                        return
                    yield msg
            finally:
                # The caller left or the stream ended: the generator's finally blocks run
                # on the pool (they release a stream slot, may touch a store), after the
                # step still running there, if any (the RPC's end makes is_active False).
                def close(_f: object = None) -> None:
                    with contextlib.suppress(RuntimeError):  # the pool is shut down
                        pool.submit(gen.close)

                if step is not None:
                    step.add_done_callback(close)
                else:
                    close()

        return call


class LoopServer:
    """A ``grpc.aio`` server on its own event-loop thread, driven from synchronous code
    with the surface of ``grpc.Server`` that the worker and
    :class:`~broker.api.pipeline.LayeredServer` use. Each registered (already layered)
    handler runs on ``pool`` through :class:`OnPool`, except the methods given a
    loop handler in ``on_loop`` (method name -> maker from the layered handler)."""

    def __init__(self, options: list[tuple[str, Any]], pool: futures.ThreadPoolExecutor) -> None:
        self.pool = pool
        self.on_pool = OnPool(pool)
        self.on_loop: dict[str, Callable[[grpc.RpcMethodHandler], grpc.RpcMethodHandler]] = {}
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="aio-api", daemon=True)
        self._thread.start()

        async def make() -> grpc.aio.Server:
            return grpc.aio.server(options=options)

        self.server: grpc.aio.Server = self._run(make())

    def _run(self, coro: Any, timeout: float | None = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def _on_loop(self, fn: Callable[[], Any]) -> Any:
        async def call() -> Any:
            return fn()

        return self._run(call())

    def _handler(self, method: str, h: grpc.RpcMethodHandler | None) -> grpc.RpcMethodHandler | None:
        if h is None:
            return None
        make = self.on_loop.get(method)
        return make(h) if make is not None else self.on_pool.handler(h)

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        tables = [MethodTable({m: self._handler(m, h) for m, h in t.handlers.items()})
                  for t in handlers]
        self._on_loop(lambda: self.server.add_generic_rpc_handlers(tuple(tables)))

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        converted = {n: self._handler(f"/{service}/{n}", h) for n, h in handlers.items()}
        self._on_loop(lambda: self.server.add_registered_method_handlers(service, converted))

    def add_insecure_port(self, address: str) -> int:
        return self._on_loop(lambda: self.server.add_insecure_port(address))

    def add_secure_port(self, address: str, credentials: grpc.ServerCredentials) -> int:
        return self._on_loop(lambda: self.server.add_secure_port(address, credentials))

    def start(self) -> None:
        self._run(self.server.start())

    def stop(self, grace: float | None) -> threading.Event:
        """Stop serving (in-flight calls get ``grace`` seconds), then the loop; the
        event is set once both are done (as ``grpc.Server.stop``'s)."""
        done = threading.Event()
        fut = asyncio.run_coroutine_threadsafe(self.server.stop(grace), self.loop)

        def finished(_f: object) -> None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            done.set()

        fut.add_done_callback(finished)
        return done


# ---- SubmitJob on the loop ---------------------------------------------------------------
class AsyncSubmit:
    """SubmitJob with the same layers, checks and answers as the synchronous pipeline
    (auth, edge, standby gate, JobService.SubmitJob, JobOps.submit), in the same order,
    on the event loop. The fast path (a cached token, a spec whose checks read nothing,
    a new job) never leaves the loop except to wait for its group commit; anything
    else runs its synchronous code on ``pool``: the answer is the same either way."""

    def __init__(self, *, authn: Authenticator, audit: AuditLog, leadership: Any, applier: Applier,
                 ops: Any, check: Callable[[pb.JobSpec, Principal | None], None],
                 checked: Callable[[pb.JobSpec, Principal | None], None],
                 pool: futures.ThreadPoolExecutor) -> None:
        """``check``: the submit checks (``submit_checks``); ``checked``: the same with
        the worker's retry on a fresh view (may read the store: pool only)."""
        self.authn, self.audit, self.leadership = authn, audit, leadership
        self.applier, self.ops, self.pool = applier, ops, pool
        self.check, self.checked = check, checked
        self.rule = METHODS[SUBMIT_METHOD]
        self._sinks: dict[int, LoopSink] = {}

    def handler(self, layered: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """The aio handler, decoding with the edge's safe deserializer of ``layered``."""
        return grpc.unary_unary_rpc_method_handler(
            self.call, request_deserializer=layered.request_deserializer,
            response_serializer=layered.response_serializer)

    def _sink(self, loop: asyncio.AbstractEventLoop) -> LoopSink:
        sink = self._sinks.get(id(loop))
        if sink is None:
            sink = self._sinks[id(loop)] = LoopSink(loop)
        return sink

    async def _blocking(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    async def _authenticate(self, ctx: grpc.aio.ServicerContext) -> Principal:
        tokens = self.authn.tokens
        if tokens is not None and not self.authn.insecure_dev:
            for key, value in ctx.invocation_metadata() or ():
                if key == "authorization" and isinstance(value, str):
                    scheme, _, rest = value.partition(" ")
                    if scheme.lower() == "bearer" and rest.strip():
                        try:
                            hit = tokens.cached(rest.strip())
                        except TokenError as e:
                            raise Unauthenticated(f"{e}; ask an operator for a new token") from None
                        if hit is not None:
                            return hit
        if self.authn.insecure_dev:
            return self.authn.authenticate(ctx)  # type: ignore[arg-type]
        # a cache miss (argon2, a store read) or a certificate: on the pool
        return await self._blocking(self.authn.authenticate, ctx)

    async def call(self, request: Any, ctx: grpc.aio.ServicerContext) -> jpb.SubmitJobResponse:
        # 1. auth (the outermost layer): refusals are audited, as AuthInterceptor does
        principal: Principal | None = None
        try:
            principal = await self._authenticate(ctx)
            authorize(principal, self.rule.permission)
        except (Unauthenticated, PermissionDenied) as e:
            await self._blocking(self.audit.record, principal, SUBMIT_METHOD, "",
                                 _peer(ctx), e.code.name, e.message)
            await ctx.abort(e.code, e.message)
        except Exception as e:  # noqa: BLE001 - e.g. the store is down: UNAVAILABLE, retry
            await ctx.abort(*to_status(e))
        assert principal is not None
        actx = AuthedContext(ctx, principal)  # type: ignore[arg-type]
        target = "" if isinstance(request, Refused) else target_of(request)
        pending = PendingAudit(principal, SUBMIT_METHOD, target, actx.peer())
        code = grpc.StatusCode.UNKNOWN
        writing: list[bool] = []  # non-empty once the job (and this record) is being written
        try:
            # 2. the edge (decode + limits) and 3. the standby gate, as on every method
            if isinstance(request, Refused):
                code = grpc.StatusCode.INVALID_ARGUMENT
                await ctx.abort(code, request.message)
            if not self.leadership.is_leader:
                code = grpc.StatusCode.UNAVAILABLE
                await ctx.abort(code, self.leadership.standby_message())
            try:
                out = await self._submit(request, principal, pending, ctx, writing)
                code = grpc.StatusCode.OK
                return out
            except grpc.aio.AbortError:
                raise
            except Exception as exc:  # noqa: BLE001 - the @rpc mapping of every servicer
                code, message = to_status(exc)
                if code is grpc.StatusCode.UNAVAILABLE:
                    ctx.set_trailing_metadata(((RETRY_PUSHBACK_KEY, RETRY_PUSHBACK_MS),))
                await ctx.abort(code, message)
                raise AssertionError("unreachable") from None
        finally:
            # every call leaves one record: a new job's rode with it, any other ending
            # (refusal, an idempotent repeat, a failed write) is written here
            # (a caller that left while its job was being written: the record rides with
            # the job, which is written all the same)
            left_mid_write = bool(writing) and code is grpc.StatusCode.UNKNOWN
            if not pending.written and not left_mid_write and code is not grpc.StatusCode.UNAVAILABLE:
                await self._blocking(self.audit.record, principal, SUBMIT_METHOD,
                                     target_of(request), actx.peer(), code.name)

    async def _submit(self, request: jpb.SubmitJobRequest, who: Principal, pending: PendingAudit,
                      ctx: grpc.aio.ServicerContext, writing: list[bool]) -> jpb.SubmitJobResponse:
        """JobService.SubmitJob on the loop (its checks in its order)."""
        if not request.HasField("spec"):
            raise InvalidArgument("spec is missing")
        if len(request.client_request_id) > 200:
            raise InvalidArgument("client_request_id is longer than 200 characters")
        spec = request.spec
        authorize(who, Permission.JOBS_SUBMIT, spec.team)
        if reads_stores(spec):
            await self._blocking(self.checked, spec, who)
        else:
            try:
                self.check(spec, who)
            except BrokerError:
                await self._blocking(self.checked, spec, who)  # its retry on a fresh view
        with self.ops.telemetry.job_span(ctx.invocation_metadata()):
            job, created = await self._create(spec, request.client_request_id, who.actor, pending,
                                              writing)
        out = jpb.SubmitJobResponse(created=created)
        out.job.CopyFrom(visible(job, who))  # one C-level copy (jobs_service.py says why)
        return out

    async def _create(self, spec: pb.JobSpec, request_id: str, actor: str,
                      pending: PendingAudit, writing: list[bool]) -> tuple[pb.Job, bool]:
        """JobOps.submit: the new job through the group commit, awaited. A spec the live
        view refuses, a team or class view that would need a store read, and a repeated
        request id take JobOps.submit's own code on the pool (with this call's audit
        record and span: the context is copied)."""
        ops = self.ops
        if spec.team not in ops._known_teams or not ops.priorities.fresh():  # noqa: SLF001
            return await self._in_context(ops.submit, spec, request_id, actor)
        try:
            ops._admissible(spec)  # noqa: SLF001 - the same checks, in memory here
        except BrokerError:
            return await self._in_context(ops.submit, spec, request_id, actor)
        out = transitions.submit(
            transitions.Submit(job_id=new_job_id(), spec=spec, client_request_id=request_id,
                               actor=actor, regions_known=ops.agents.any_registered()),
            ops.clock(), ops.config)
        ops.telemetry.stamp_job(out.job)
        writing.append(True)
        try:
            done = await self.applier.create_soon(out, pending, self._sink(asyncio.get_running_loop()))
            return done.job, True
        except AlreadyExists:
            writing.clear()  # answered below: the interceptor's record, as for any repeat
            store = self.applier.store
            existing = await self._blocking(store.find_job_by_request_id, spec.team, request_id)
            if existing is None:
                raise
            await self._blocking(store.confirm_replicated)
            return existing, False

    async def _in_context(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn`` on the pool with this task's context variables (the pending audit
        record rides the job's write there too; the job's span)."""
        context = contextvars.copy_context()
        return await asyncio.get_running_loop().run_in_executor(self.pool, context.run, fn, *args)


def reads_stores(spec: pb.JobSpec) -> bool:
    """Whether a spec's submit checks read a store (workdir blob, checkpoint prefixes,
    the resume source's job), so run on the pool rather than on the loop."""
    return bool(spec.HasField("workdir") or spec.checkpoint_uri or spec.resume_from)


def _peer(ctx: grpc.aio.ServicerContext) -> str:
    from broker.api.peer_gate import real_peer

    return real_peer(ctx.peer())
