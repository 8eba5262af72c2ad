"""The console's routes (Starlette): sign-in, the pages, their live streams, actions.

Every request after sign-in is served with the session's own SDK client
(identity.client_for): the broker sees the user, so its roles decide. Actions (drain,
cordon, cancel) are POST forms that carry the session's CSRF token; a POST whose Origin
is another site's is refused before anything else.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlencode, urlsplit

import grpc
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from brokersdk.client import BrokerError, BrokerUnavailable, NotFound, PermissionDenied
from console import live
from console.identity import ClientSettings, client_for, identify
from console.jobview import log_text
from console.pages import LOADERS, Page, template_globals
from console.sessions import COOKIE, Session, SessionsFull, SessionStore, cookie_args

HERE = Path(__file__).parent

# HTTP status of a broker error shown as a page.
_STATUS = ((PermissionDenied, 403), (NotFound, 404), (BrokerUnavailable, 503))

SECURITY_HEADERS = {
    # Scripts only from this origin (no inline script); inline style attributes draw bars.
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self' "
                               "'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none';"
                               " form-action 'self'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    # same-origin, not no-referrer: with no-referrer browsers send "Origin: null" on
    # form posts, and the Origin check below needs the real one.
    "Referrer-Policy": "same-origin",
}


class SecurityHeaders:
    """Adds :data:`SECURITY_HEADERS` to every response (pages, streams, static files)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.headers = [(k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], *self.headers]
            await send(message)

        await self.app(scope, receive, with_headers)


@dataclass
class ConsoleConfig:
    """How the console reaches the broker and how it keeps sessions."""

    broker: str  # "" = the client config context's server
    timeout: float = 10.0
    context: str = ""  # client config context for the transport (CA); never its identity
    secure_cookie: bool = True  # browsers keep Secure cookies over TLS and on loopback
    session_idle_s: float = 8 * 3600


def create_app(config: ConsoleConfig, settings: ClientSettings | None = None) -> Starlette:
    """``settings``: the transport to the broker when the caller has it already (the demo
    passes its own CA); otherwise resolved from the config context / CB_* variables."""
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.globals.update(template_globals())
    sessions = SessionStore(config.session_idle_s)
    if settings is None:
        settings = ClientSettings.resolve(config.broker, config.timeout, config.context)

    def session_of(request: Request) -> Session | None:
        return sessions.get(request.cookies.get(COOKIE))

    def render(request: Request, name: str, context: dict[str, Any], status: int = 200,
               session: Session | None = None) -> Response:
        ctx = {"session": session, "identity": session.identity if session else None,
               "csrf": session.csrf if session else "", "layout": "base.html", **context}
        resp = templates.TemplateResponse(request, name, ctx, status_code=status)
        resp.headers["Cache-Control"] = "no-store"  # pages show one user's view
        return resp

    def problem(request: Request, session: Session | None, err: BrokerError) -> Response:
        if err.code is grpc.StatusCode.UNAUTHENTICATED and session is not None:
            # The token was revoked or expired: this session is over.
            sessions.drop(session.id)
            return render(request, "signin.html", {"error": err.message, "broker": settings.address},
                          401)
        status = next((s for cls, s in _STATUS if isinstance(err, cls)), 400)
        return render(request, "problem.html", {"message": err.message, "hint": err.hint,
                                                "status": status}, status, session)

    def same_origin(request: Request) -> bool:
        origin = request.headers.get("origin")
        if not origin or origin == "null":
            return origin is None
        o = urlsplit(origin)
        return (o.scheme, o.netloc) == (request.url.scheme, request.url.netloc)

    # ---- sign-in -------------------------------------------------------------------------
    async def signin_form(request: Request) -> Response:
        return render(request, "signin.html", {"error": "", "broker": settings.address,
                                               "cookie_warning": cookie_lost(request)})

    def cookie_lost(request: Request) -> bool:
        """Browsers drop Secure cookies over plain HTTP, except on loopback."""
        host = request.url.hostname or ""
        return (config.secure_cookie and request.url.scheme == "http"
                and host not in ("localhost", "::1") and not host.startswith("127."))

    async def signin(request: Request) -> Response:
        if not same_origin(request):
            return PlainTextResponse("cross-site request refused", 403)
        form = await request.form()
        token = str(form.get("token") or "").strip()

        def attempt() -> tuple[Any, Any]:
            client = client_for(SimpleNamespace(token=token), settings)  # not a session yet
            try:
                return client, identify(client)
            except BaseException:
                client.close()
                raise

        try:
            client, who = await run_in_threadpool(attempt)
        except BrokerError as e:
            return render(request, "signin.html", {"error": e.message, "broker": settings.address},
                          401)
        try:
            session = sessions.create(token, who, client)
        except SessionsFull as e:
            client.close()
            return render(request, "signin.html", {"error": str(e), "broker": settings.address},
                          503)
        resp = RedirectResponse("/fleet", 303)
        resp.set_cookie(COOKIE, session.id, max_age=int(config.session_idle_s),
                        **cookie_args(config.secure_cookie))
        return resp

    async def signout(request: Request) -> Response:
        session = session_of(request)
        form = await request.form()
        if session is None or not same_origin(request) or not session.csrf_ok(
                str(form.get("csrf") or "")):
            return PlainTextResponse("sign-out refused: stale form", 403)
        sessions.drop(session.id)
        resp = RedirectResponse("/signin", 303)
        resp.delete_cookie(COOKIE, **cookie_args(config.secure_cookie))
        return resp

    # ---- pages ---------------------------------------------------------------------------
    def page_route(page: Page):  # noqa: ANN202 - a route factory
        async def handler(request: Request) -> Response:
            session = session_of(request)
            if session is None:
                return RedirectResponse("/signin", 303)
            params = {**request.query_params, **request.path_params}
            try:
                ctx = await run_in_threadpool(LOADERS[page], session.client, params,
                                              session.identity)
            except BrokerError as e:
                return problem(request, session, e)
            live_url = f"/live/{page.name.lower()}?{urlencode(params)}"
            flash, session.flash = session.flash, ""
            return render(request, page.template, {**ctx, "page": page.name.lower(),
                                                   "live_url": live_url, "flash": flash},
                          200, session)
        return handler

    async def live_stream(request: Request) -> Response:
        session = session_of(request)
        if session is None:
            return PlainTextResponse("sign in first", 401)
        try:
            page = Page[request.path_params["page"].upper()]
        except KeyError:
            return PlainTextResponse("no such page", 404)
        params = dict(request.query_params)
        if page is Page.JOB and not params.get("job_id"):
            return PlainTextResponse("job_id is required", 400)
        template = templates.get_template(page.template)

        def render_fragment() -> str:
            ctx = LOADERS[page](session.client, params, session.identity)
            return template.render({**template_globals(), **ctx, "layout": "fragment.html",
                                    "session": session, "identity": session.identity,
                                    "csrf": session.csrf, "page": page.name.lower()})

        watch = None
        if page is Page.JOB:
            def watch(notify, stop):  # noqa: ANN001, ANN202
                live.watch_job(session.client, params["job_id"], notify, stop)

        body = live.stream_page(render_fragment, request.is_disconnected, page.interval_s, watch)
        return StreamingResponse(body, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    async def root(request: Request) -> Response:
        return RedirectResponse("/fleet" if session_of(request) else "/signin", 303)

    async def find_job(request: Request) -> Response:
        job_id = request.query_params.get("id", "").strip()
        if job_id:
            return RedirectResponse(request.url_for("job", job_id=job_id).path, 303)
        return await page_route(Page.JOBS)(request)

    # ---- actions (operators) --------------------------------------------------------------
    async def action(request: Request) -> Response:
        session = session_of(request)
        if session is None:
            return RedirectResponse("/signin", 303)
        form = await request.form()
        if not same_origin(request) or not session.csrf_ok(str(form.get("csrf") or "")):
            return PlainTextResponse("action refused: missing or stale CSRF token (reload the"
                                     " page)", 403)
        name = request.path_params["name"]
        back = str(form.get("back") or "/fleet")
        if not back.startswith("/") or back.startswith("//"):
            back = "/fleet"
        client = session.client
        undo = form.get("undo") == "1"
        try:
            if name == "drain":
                region = str(form.get("region") or "")
                resp = await run_in_threadpool(client.drain, region, undo,
                                               str(form.get("reason") or "console"))
                msg = (f"region {region} accepts work again" if undo else
                       f"region {region} draining; moving {len(resp.moved_job_ids)} job(s)")
            elif name == "cordon":
                node = str(form.get("node") or "")
                await run_in_threadpool(client.cordon, node, undo)
                msg = f"node {node} {'uncordoned' if undo else 'cordoned'}"
            elif name == "cancel":
                job_id = str(form.get("job_id") or "")
                await run_in_threadpool(client.cancel, job_id, "cancelled from the console")
                msg = f"job {job_id} cancelling"
            else:
                return PlainTextResponse("no such action", 404)
        except BrokerError as e:
            return problem(request, session, e)
        session.flash = msg
        return RedirectResponse(back, 303)

    async def log_download(request: Request) -> Response:
        """The job's whole log (every attempt the broker keeps) as a text file."""
        session = session_of(request)
        if session is None:
            return RedirectResponse("/signin", 303)
        job_id = request.path_params["job_id"]

        def read() -> str:
            return "".join(f"{line}\n" for line in log_text(session.client.logs(job_id), 0))

        try:
            text = await run_in_threadpool(read)
        except BrokerError as e:
            return problem(request, session, e)
        safe = "".join(c for c in job_id if c.isalnum() or c in "-_") or "job"
        return PlainTextResponse(text, headers={
            "Content-Disposition": f'attachment; filename="{safe}.log"', "Cache-Control": "no-store"})

    async def health(request: Request) -> Response:
        return PlainTextResponse("ok")

    routes = [
        Route("/", root),
        Route("/healthz", health),
        Route("/favicon.ico", lambda request: Response(status_code=204)),
        Route("/signin", signin_form, methods=["GET"]),
        Route("/signin", signin, methods=["POST"]),
        Route("/signout", signout, methods=["POST"]),
        Route("/fleet", page_route(Page.FLEET), name="fleet"),
        Route("/queue", page_route(Page.QUEUE), name="queue"),
        Route("/jobs", find_job, name="jobs"),
        Route("/jobs/{job_id}", page_route(Page.JOB), name="job"),
        Route("/jobs/{job_id}/log.txt", log_download, name="job_log"),
        Route("/migrations", page_route(Page.MIGRATIONS), name="migrations"),
        Route("/plans", page_route(Page.PLANS), name="plans"),
        Route("/charts", page_route(Page.CHARTS), name="charts"),
        Route("/live/{page}", live_stream, name="live"),
        Route("/actions/{name}", action, methods=["POST"]),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    app = Starlette(routes=routes, middleware=[Middleware(SecurityHeaders)])
    app.state.sessions = sessions
    return app
