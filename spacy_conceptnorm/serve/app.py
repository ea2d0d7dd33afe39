"""The curation server: a FastAPI app over a `Curation` session, and the page it serves (static/, plain HTML and
JavaScript that builds every element from text, never from markup).

Security: `check_bind` refuses an address other than loopback without a token; with a token every /api request
needs `Authorization: Bearer TOKEN` (the page reads it from its URL's #token=... fragment, which is never sent to
the server); the Host header must name the bound address (no DNS rebinding); requests that change anything must
be JSON (a cross-site form cannot send it without a CORS preflight, which is never granted); bodies over
MAX_BODY bytes are refused; a strict Content-Security-Policy forbids inline script.
"""

from __future__ import annotations

import hmac
import ipaddress
from pathlib import Path
from typing import Annotated, Literal

from fastapi import FastAPI, Query, Request
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, StringConstraints
from starlette.datastructures import Headers, MutableHeaders
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import ConceptNormError, Errors
from .curation import STATUSES, Curation, CurationError, Filters

STATIC = Path(__file__).parent / "static"
MAX_BODY = 16 * 1024  # bytes: every request body is a small JSON object
MAX_PAGE = 200
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    "cache-control": "no-store",
}

ConceptId = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class DecisionBody(Body):
    """action (str): "accept", "choose" or "nil". concept_id (Optional[str]): The concept, for "choose"."""

    action: Literal["accept", "choose", "nil"]
    concept_id: ConceptId | None = None


class SynonymBody(Body):
    """concept_id (str): The concept the mention's text becomes a synonym of."""

    concept_id: ConceptId


class EmptyBody(Body):
    """No fields: undo and save take none."""


def is_loopback(host: str) -> bool:
    """Whether an address to bind to is reachable from this machine only."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    """Raise ConceptNormError for an address other than loopback without a token."""
    if not token and not is_loopback(host):
        raise ConceptNormError(Errors.E970.format(host=host))


def _error(status: int, message: str, **more: object) -> JSONResponse:
    return JSONResponse({"error": message, **more}, status_code=status)


class Guard:
    """ASGI middleware: the token on /api, JSON-only and size-limited request bodies, security headers."""

    def __init__(self, app: ASGIApp, token: str | None = None, max_body: int = MAX_BODY) -> None:
        self.app = app
        self.token = token
        self.max_body = max_body

    def _refusal(self, scope: Scope) -> JSONResponse | None:
        headers = Headers(scope=scope)
        if self.token and scope["path"].startswith("/api"):
            given = headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode()):
                return _error(401, "Missing or wrong token: send 'Authorization: Bearer TOKEN'.")
        if scope["method"] not in ("GET", "HEAD"):
            if headers.get("content-type", "").split(";")[0].strip().lower() != "application/json":
                return _error(415, "Request bodies must be JSON (Content-Type: application/json).")
            length = headers.get("content-length")
            if length is not None and (not length.isdigit() or int(length) > self.max_body):
                return _error(413, f"Request body over {self.max_body} bytes.")
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for key, value in SECURITY_HEADERS.items():
                    headers.setdefault(key, value)
            await send(message)

        refusal = self._refusal(scope)
        if refusal is not None:
            await refusal(scope, receive, send_secured)
            return
        if scope["method"] not in ("GET", "HEAD"):  # read the body whole, within the limit, then hand it on
            body, more = b"", True
            while more:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                body += message.get("body", b"")
                more = message.get("more_body", False)
                if len(body) > self.max_body:
                    await _error(413, f"Request body over {self.max_body} bytes.")(scope, receive, send_secured)
                    return
            replayed = False

            async def receive_body() -> Message:
                nonlocal replayed
                if replayed:
                    return await receive()
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}

            await self.app(scope, receive_body, send_secured)
            return
        await self.app(scope, receive, send_secured)


def _validation_message(errors: list[dict]) -> str:
    parts = [f"{'.'.join(str(x) for x in e['loc'][1:]) or e['loc'][0]}: {e['msg']}" for e in errors]
    return "Invalid request: " + "; ".join(parts)


def create_app(curation: Curation, token: str | None = None, allowed_hosts: list[str] | None = None) -> FastAPI:
    """The curation app.

    curation (Curation): The session.
    token (Optional[str]): Required on every /api request (Authorization: Bearer TOKEN) when set.
    allowed_hosts (Optional[List[str]]): Host header values accepted (e.g. the loopback names); None: any.
    RETURNS (FastAPI): The app, for uvicorn or a TestClient.
    """
    app = FastAPI(title="spacy_conceptnorm curation", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.curation = curation

    @app.exception_handler(CurationError)
    async def curation_error(request: Request, exc: CurationError) -> JSONResponse:
        return _error(exc.status, str(exc))

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{k: v for k, v in e.items() if k in ("loc", "msg", "type")} for e in exc.errors()]
        return _error(422, _validation_message(errors), detail=errors)

    @app.get("/", include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(STATIC / "index.html", media_type="text/html")

    # The endpoints answer with JSONResponse: FastAPI's jsonable_encoder takes 9 ms over a page of 50 rows.
    @app.get("/api/info")
    def info() -> JSONResponse:
        return JSONResponse(curation.info())

    @app.get("/api/mentions")
    def mentions(
        offset: int = Query(0, ge=0),
        limit: int = Query(50, ge=1, le=MAX_PAGE),
        concept: str = Query("", max_length=200),
        label: str = Query("", max_length=200),
        document: str = Query("", max_length=500),
        status: Literal[STATUSES] = Query("all"),  # type: ignore[valid-type]
        q: str = Query("", max_length=200),
    ) -> JSONResponse:
        filters = Filters(concept.strip(), label, document.strip(), status, q.strip())
        return JSONResponse(curation.page(filters, offset, limit))

    @app.get("/api/mentions/{mention_id}")
    def mention(mention_id: int = PathParam(ge=0)) -> JSONResponse:
        return JSONResponse(curation.row(mention_id))

    @app.post("/api/mentions/{mention_id}/decision")
    def decide(body: DecisionBody, mention_id: int = PathParam(ge=0)) -> JSONResponse:
        return JSONResponse(curation.decide(mention_id, body.action, body.concept_id))

    @app.post("/api/mentions/{mention_id}/synonym")
    def synonym(body: SynonymBody, mention_id: int = PathParam(ge=0)) -> JSONResponse:
        return JSONResponse(curation.add_synonym(mention_id, body.concept_id))

    @app.post("/api/undo")
    def undo(body: EmptyBody) -> JSONResponse:
        return JSONResponse(curation.undo())

    @app.get("/api/search")
    def search(q: str = Query(..., min_length=1, max_length=200), limit: int = Query(10, ge=1, le=50)) -> JSONResponse:
        return JSONResponse({"query": q, "results": curation.search(q, limit)})

    @app.get("/api/nil-clusters")
    def nil_clusters(offset: int = Query(0, ge=0), limit: int = Query(20, ge=1, le=MAX_PAGE)) -> JSONResponse:
        return JSONResponse(curation.nil_clusters(offset, limit))

    @app.get("/api/reviews")
    def reviews(limit: int = Query(20, ge=1, le=MAX_PAGE)) -> JSONResponse:
        with curation.lock:
            return JSONResponse({"reviews": curation.log.events[::-1][:limit]})

    @app.post("/api/pipeline/save")
    def save(body: EmptyBody) -> JSONResponse:
        return JSONResponse({"path": curation.save_pipeline()})

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    if allowed_hosts is not None:
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts)
    app.add_middleware(Guard, token=token)
    return app
