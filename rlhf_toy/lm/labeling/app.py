"""The labeling web app: FastAPI, served by uvicorn (the 'label' extra).

Routes (JSON in and out; a token, when one is required, as `?token=` or the `X-Token` header):

    GET  /                      the page (page.html)
    GET  /api/next?labeler=NAME the next pair for NAME, and the progress
    POST /api/label             {"pair_id", "choice": left|right|tie|skip, "labeler"} -> the next pair, progress
    POST /api/undo              {"labeler", "current": pair on screen or null} -> the retracted pair, progress
    GET  /api/progress

Safe by default: it binds 127.0.0.1 and answers only requests addressed to a loopback name or the bound address
(another site's page in the same browser cannot reach it through DNS rebinding); any other host needs the token
the command prints. Bodies are bounded
(`MAX_BODY` bytes, a Content-Length required), every field is validated by its pydantic model, and nothing
from a request names a file: the log's path is fixed when the command starts.
"""

from __future__ import annotations

import html
import secrets
import socket
from dataclasses import dataclass
from importlib import resources
from typing import Literal

import uvicorn
from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.middleware.trustedhost import TrustedHostMiddleware

from rlhf_toy.errors import UserError

from .session import LABELER, LabelError, LabelSession, Pair

MAX_BODY = 2048  # bytes: a label is about 100
PAIR_ID = r"^[0-9a-f]{16}$"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


class LabelIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pair_id: str = Field(pattern=PAIR_ID)
    choice: Literal["left", "right", "tie", "skip"]
    labeler: str = Field(pattern=LABELER)


class UndoIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    labeler: str = Field(pattern=LABELER)
    current: str | None = Field(default=None, pattern=PAIR_ID)


def _answer(pair: Pair, session: LabelSession) -> dict:
    return {"pair": pair.public(), "progress": session.progress()}


def _refused(exc: LabelError) -> HTTPException:
    return HTTPException(exc.status, str(exc))


def allowed_hosts(bound: str) -> list[str]:
    """The `Host` header values the page answers: the loopback names and the address it is bound to. A request
    naming any other host is a page elsewhere reaching this one through DNS rebinding, and gets 400. Bound to
    every interface (0.0.0.0, ::), any name may reach it: the token guards it then."""
    if bound in ("0.0.0.0", "::", ""):
        return ["*"]
    return ["127.0.0.1", "localhost", "[::1]", f"[{bound}]" if ":" in bound else bound]


def build_app(
    session: LabelSession, token: str | None = None, labeler: str = "me", hosts: list[str] | None = None
) -> FastAPI:
    """The app over one session; with `token`, every request must carry it; `hosts`: the `Host` names it
    answers (default: loopback only)."""
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=hosts or allowed_hosts("127.0.0.1"))
    page = resources.files(__package__).joinpath("page.html").read_text(encoding="utf-8")
    page = page.replace("{{labeler}}", html.escape(labeler))

    @app.middleware("http")
    async def guard(request: Request, call_next):
        if token is not None:
            given = request.query_params.get("token") or request.headers.get("x-token") or ""
            if not secrets.compare_digest(given.encode(), token.encode()):
                return JSONResponse({"detail": "wrong or missing token: open the address the command printed"}, 403)
        if request.method == "POST":
            size = request.headers.get("content-length")
            if size is None or not size.isdigit():
                return JSONResponse({"detail": "a Content-Length header is required"}, 411)
            if int(size) > MAX_BODY:
                return JSONResponse({"detail": f"request body over {MAX_BODY} bytes"}, 413)
        return await call_next(request)

    @app.get("/", response_class=HTMLResponse)
    def index() -> str:
        return page

    @app.get("/api/progress")
    def progress() -> dict:
        return session.progress()

    @app.get("/api/next")
    def next_pair(labeler: str = Query(pattern=LABELER)) -> dict:
        try:
            return _answer(session.next_pair(labeler), session)
        except (RuntimeError, TimeoutError) as exc:
            raise HTTPException(503, str(exc)) from None

    @app.post("/api/label")
    def label(body: LabelIn) -> dict:
        try:
            session.label(body.pair_id, body.choice, body.labeler)
            return _answer(session.next_pair(body.labeler), session)
        except LabelError as exc:
            raise _refused(exc) from None
        except (RuntimeError, TimeoutError) as exc:
            raise HTTPException(503, str(exc)) from None

    @app.post("/api/undo")
    def undo(body: UndoIn) -> dict:
        try:
            return _answer(session.undo(body.labeler, body.current), session)
        except LabelError as exc:
            raise _refused(exc) from None

    return app


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: any free one), or a one-line error naming the fix."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)  # connections wait in the backlog from here: the printed address works at once
    except OSError as exc:
        sock.close()
        raise UserError(
            f"cannot serve on {host}:{port} ({exc.strerror}); pass another --port (0: any free one)"
        ) from None
    return sock


@dataclass
class Served:
    """A uvicorn server over the app, its bound socket, and the page's address (with the token, if any)."""

    server: uvicorn.Server
    sock: socket.socket
    url: str

    def run(self) -> None:
        """Serve until Ctrl-C (or `server.should_exit`): uvicorn finishes the requests in flight, then returns."""
        try:
            self.server.run(sockets=[self.sock])
        except KeyboardInterrupt:  # uvicorn re-raises the Ctrl-C it handled: here it is the normal way to stop
            pass
        finally:
            self.sock.close()


def open_server(session: LabelSession, sock: socket.socket, labeler: str = "me") -> Served:
    """The server over `session` on a socket from `bind`; a token is required when it is not bound to loopback."""
    host = sock.getsockname()[0]
    token = None if host in LOOPBACK else secrets.token_urlsafe(16)
    app = build_app(session, token, labeler, allowed_hosts(host))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
    bound, bound_port = sock.getsockname()[:2]
    shown = f"[{bound}]" if ":" in bound else bound
    return Served(server, sock, f"http://{shown}:{bound_port}/" + (f"?token={token}" if token else ""))
