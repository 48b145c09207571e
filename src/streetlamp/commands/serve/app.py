"""The ASGI app of ``streetlamp serve`` (Starlette): the page, its static files, and a JSON API.

Security (every request, before any routing): the ``Host`` header must be the bound host and port
(DNS rebinding), a cross-origin request is refused (``Origin`` must be this server, ``Sec-Fetch-Site``
same-origin or none), and the access token must come with it (``?token=`` on the first page load,
which sets a cookie; or the ``X-Streetlamp-Token`` header); otherwise 403. Limits: the request body
size, the text length (the model's positions, see compute.encode), one computation per model at a
time with a bounded queue (503 "busy" when full) and a per-request timeout (504). Every error
reaches the page as ``{"error": "one sentence"}``; nothing a request sends stops the server.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ... import progress
from ...errors import StreetlampError
from ...models.adapter import ModelAdapter
from . import compute as C

log = logging.getLogger("streetlamp.commands.serve")
HEADER = "x-streetlamp-token"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; "
    "connect-src 'self'; frame-src 'self'; base-uri 'none'; form-action 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP + "; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Resource-Policy": "same-origin",
}
# /frame: one explain view of a minimal pair, framed by this server's own page only
FRAME_HEADERS = {
    **SECURITY_HEADERS,
    "Content-Security-Policy": CSP + "; frame-ancestors 'self'",
    "X-Frame-Options": "SAMEORIGIN",
}


@dataclass
class Limits:
    max_body: int = 256 * 1024  # bytes of a request body
    max_chars: int = 100_000  # characters of one text (the token limit is the model's positions)
    queue: int = 8  # requests waiting per model behind the running one; more get 503 busy
    timeout: float = 300.0  # seconds a request may wait and run before 504
    kept: int = 16  # recent results kept for "save"
    jobs: int = 256  # progress records kept


class Busy(Exception):
    pass


class Cancelled(Exception):
    pass


class TooLarge(StreetlampError):
    pass


def _err(status: int, msg: str) -> JSONResponse:
    return JSONResponse({"error": msg}, status_code=status, headers=SECURITY_HEADERS)


class Guard:
    """ASGI middleware: Host, cross-origin and token checks on every HTTP request."""

    def __init__(self, app: ASGIApp, token: str, hosts: set[str], origins: set[str], cookie: str) -> None:
        self.app, self.token, self.hosts, self.origins, self.cookie = app, token, hosts, origins, cookie

    def _ok(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self.token.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        req = Request(scope)
        h = req.headers
        why = None
        if h.get("host", "").lower() not in self.hosts:
            why = "wrong Host header: open the page at the address streetlamp serve printed"
        elif "origin" in h and h["origin"].lower() not in self.origins:
            why = "cross-origin request refused"
        elif h.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
            why = "cross-site request refused"
        if why is None:
            q = req.query_params.get("token")
            if req.method == "GET" and scope["path"] == "/" and q is not None:
                if not self._ok(q):
                    why = "wrong access token"
                else:  # first load: keep the token in a cookie, drop it from the address bar
                    r = RedirectResponse("/", status_code=303, headers=SECURITY_HEADERS)
                    r.set_cookie(self.cookie, self.token, httponly=True, samesite="strict", path="/")
                    return await r(scope, receive, send)
            elif not (self._ok(h.get(HEADER)) or self._ok(req.cookies.get(self.cookie))):
                why = "access token missing or wrong: open the URL with ?token= that streetlamp serve printed"
        if why is not None:
            return await _err(403, why)(scope, receive, send)
        return await self.app(scope, receive, send)


class Worker:
    """One computation at a time for one model, at most ``queue`` waiting."""

    def __init__(self, adapter: ModelAdapter, queue: int) -> None:
        self.adapter, self.queue = adapter, queue
        self.lock = asyncio.Lock()
        self.waiting = 0
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"streetlamp-{adapter.name}")


class State:
    def __init__(self, adapters: dict[str, ModelAdapter], limits: Limits, runs_dir: Path) -> None:
        self.adapters, self.limits, self.runs_dir = adapters, limits, Path(runs_dir)
        self.workers: dict[str, Worker] = {}
        self.results: OrderedDict[str, C.Live] = OrderedDict()
        self.jobs: OrderedDict[str, dict] = OrderedDict()

    def worker(self, name: str) -> Worker:
        if name not in self.workers:  # created lazily, inside the server's event loop
            self.workers[name] = Worker(self.adapters[name], self.limits.queue)
        return self.workers[name]

    def job(self, jid: str) -> dict:
        j = self.jobs.setdefault(
            jid,
            {
                "state": "queued",
                "stage": "waiting for the model",
                "started": time.time(),
                "cancel": False,
                "stages": [],
                "step": None,
            },
        )
        while len(self.jobs) > self.limits.jobs:
            self.jobs.popitem(last=False)
        return j

    def keep(self, live: C.Live) -> str:
        rid = secrets.token_hex(8)
        self.results[rid] = live
        while len(self.results) > self.limits.kept:
            self.results.popitem(last=False)
        return rid


async def read_json(request: Request, limits: Limits) -> dict:
    n = request.headers.get("content-length")
    if n is not None and (not n.isdigit() or int(n) > limits.max_body):
        raise TooLarge(f"request too large: at most {limits.max_body // 1024} KiB")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > limits.max_body:
            raise TooLarge(f"request too large: at most {limits.max_body // 1024} KiB")
    try:
        data = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise StreetlampError("the request is not valid JSON") from None
    if not isinstance(data, dict):
        raise StreetlampError("the request must be a JSON object")
    for k, v in data.items():
        if isinstance(v, str) and len(v) > limits.max_chars:
            raise StreetlampError(f"{k} is too long: at most {limits.max_chars:,} characters")
    return data


def _jsonable(x: Any) -> Any:
    """NaN and infinities become null (JSON has neither)."""
    if isinstance(x, float):
        return x if x == x and abs(x) != float("inf") else None
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def create_app(
    adapters: dict[str, ModelAdapter],
    token: str,
    host: str = "127.0.0.1",
    port: int = 8765,
    limits: Limits | None = None,
    runs_dir: Path | str = "runs/serve",
) -> Starlette:
    """The app for ``adapters`` (name -> model), reachable as ``http://host:port`` with ``token``."""
    if not adapters:
        raise StreetlampError("streetlamp serve needs at least one model")
    if len(token) < 16:
        raise StreetlampError("the access token must have at least 16 characters")
    limits = limits or Limits()
    st = State(adapters, limits, Path(runs_dir))
    names = [f"{host}:{port}"] + (
        [f"localhost:{port}", f"127.0.0.1:{port}"] if host in ("127.0.0.1", "localhost") else []
    )
    hosts = {n.lower() for n in names}
    origins = {f"http://{n}".lower() for n in names}

    def model_info(name: str) -> dict:
        a = adapters[name]
        return {
            "name": name,
            "kind": a.kind,
            "layers": a.n_layers,
            "heads": a.n_heads,
            "max_positions": a.max_positions,
            "replacements": C.replacement_menu(a),
        }

    def html_page(view: str, script: str, title: str, extra: dict | None = None) -> str:
        from ...report.viewer import SCRIPTS, script_json
        from ...report.viewer.palettes import palettes

        boot = {"view": view, "manifest": {}, "arrays": {}, "palettes": palettes(), **(extra or {})}
        scripts = "".join(f'<script src="/static/{s}"></script>\n' for s in (*SCRIPTS, script))
        return (
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">\n'
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f'<title>{title}</title>\n<link rel="icon" href="data:,">\n'
            '<link rel="stylesheet" href="/static/viewer.css"><link rel="stylesheet" href="/static/live.css">\n'
            "</head><body>\n<noscript>streetlamp serve needs JavaScript.</noscript>\n"
            '<div id="app" aria-live="polite">loading...</div>\n'
            f'<script type="application/json" id="sl-model">{script_json(boot)}</script>\n{scripts}</body></html>\n'
        )

    async def page(request: Request) -> Response:
        live = {
            "models": [model_info(n) for n in adapters],
            "methods": sorted(C.REGISTRY),
            "default_methods": list(C.DEFAULT_METHODS),
            "max_chars": limits.max_chars,
        }
        html = html_page("live", "live.js", "streetlamp serve", {"live": live})
        return Response(html, media_type="text/html; charset=utf-8", headers=SECURITY_HEADERS)

    async def frame(request: Request) -> Response:
        """An empty report page: the live page draws one text of a minimal pair into it with the report's
        own ``streetlamp.render`` (each frame has its own viewer state, so two explain views can sit side by side)."""
        html = html_page("blank", "frame.js", "streetlamp serve: explain view")
        return Response(html, media_type="text/html; charset=utf-8", headers=FRAME_HEADERS)

    viewer_static = resources.files("streetlamp.report.viewer").joinpath("static")
    live_static = resources.files(__package__).joinpath("static")

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        if not re.fullmatch(r"[a-z]+\.(js|css)", name):
            return _err(404, "no such file")
        for root in (live_static, viewer_static):
            f = root.joinpath(name)
            if f.is_file():
                kind = "text/javascript" if name.endswith(".js") else "text/css"
                return Response(
                    f.read_text(encoding="utf-8"), media_type=f"{kind}; charset=utf-8", headers=SECURITY_HEADERS
                )
        return _err(404, "no such file")

    async def run(request: Request, fn: Callable[[ModelAdapter, dict, Callable[[str], None]], C.Live]) -> Response:
        try:
            data = await read_json(request, limits)
            name = data.get("model") or next(iter(adapters))
            if not isinstance(name, str) or name not in adapters:
                raise StreetlampError(f"unknown model {name!r}; this server has {', '.join(adapters)}")
            jid = data.get("job")
            jid = jid if isinstance(jid, str) and re.fullmatch(r"[A-Za-z0-9_-]{8,64}", jid) else secrets.token_hex(8)
            w = st.worker(name)
            if w.lock.locked() and w.waiting >= w.queue:
                raise Busy(f"busy: {name} is computing and {w.waiting} request(s) are waiting; try again shortly")
            job = st.job(jid)
            job.update(position=w.waiting + (1 if w.lock.locked() else 0))

            def stage(s: str) -> None:
                if job["cancel"]:
                    raise Cancelled()
                job.update(stage=s, state="running", step=None)
                job["stages"].append([round(time.time() - job["started"], 3), s])

            def step(what: str, done: int, total: int) -> None:  # finer progress inside a stage (methods' bars)
                if job["cancel"]:
                    raise Cancelled()
                job["step"] = {"what": what, "done": done, "total": total}

            def work() -> C.Live:
                with progress.listening(step):
                    return fn(w.adapter, data, stage)

            deadline = time.monotonic() + limits.timeout
            w.waiting += 1
            try:
                await asyncio.wait_for(w.lock.acquire(), timeout=limits.timeout)
            except TimeoutError:
                job["state"] = "failed"
                return _err(504, f"timed out after {limits.timeout:g} s waiting for {name}")
            finally:
                w.waiting -= 1
            fut = asyncio.get_running_loop().run_in_executor(w.pool, work)
            fut.add_done_callback(lambda _: w.lock.release())  # the model stays busy until the thread ends
            try:
                live = await asyncio.wait_for(asyncio.shield(fut), timeout=max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                job["cancel"], job["state"] = True, "failed"
                fut.add_done_callback(lambda f: f.exception())  # consumed: no "never retrieved" noise
                return _err(504, f"timed out after {limits.timeout:g} s (the computation stops at its next step)")
            job["state"], job["stage"] = "done", "done"
            rid = st.keep(live)
            return JSONResponse(
                _jsonable({"id": rid, "job": jid, "model": name, **live.payload}), headers=SECURITY_HEADERS
            )
        except Busy as e:
            return _err(503, str(e))
        except TooLarge as e:
            return _err(413, str(e))
        except StreetlampError as e:
            return _err(400, str(e))
        except Exception as e:  # noqa: BLE001 - the server keeps running; the page gets one sentence
            log.exception("request failed")
            first = (str(e).splitlines() or [""])[0][:200]
            return _err(
                500, f"internal error ({type(e).__name__}{': ' + first if first else ''}); the server keeps running"
            )

    def truncate(d: dict) -> bool:
        t = d.get("truncate", False)
        if not isinstance(t, bool):
            raise StreetlampError("truncate must be true or false")
        return t

    async def api_explain(request: Request) -> Response:
        return await run(
            request,
            lambda a, d, s: C.explain_text(a, d.get("text"), truncate=truncate(d), methods=d.get("methods"), stage=s),
        )

    async def api_edit(request: Request) -> Response:
        return await run(
            request,
            lambda a, d, s: C.edit_tokens(
                a,
                d.get("text"),
                d["edits"] if "edits" in d else [{k: d.get(k) for k in ("position", "op", "replacement")}],
                truncate=truncate(d),
                methods=d.get("methods"),
                stage=s,
            ),
        )

    async def api_ablate(request: Request) -> Response:
        return await run(
            request,
            lambda a, d, s: C.ablate_heads(
                a, d.get("text"), d.get("heads"), d.get("ablation", "zero"), truncate=truncate(d), stage=s
            ),
        )

    async def api_pair(request: Request) -> Response:
        return await run(
            request,
            lambda a, d, s: C.minimal_pair(
                a, d.get("text_a"), d.get("text_b"), truncate=truncate(d), methods=d.get("methods"), stage=s
            ),
        )

    async def api_progress(request: Request) -> Response:
        j = st.jobs.get(request.path_params["job"])
        if j is None:
            return _err(404, "no such job")
        return JSONResponse(
            {
                "state": j["state"],
                "stage": j["stage"],
                "position": j.get("position", 0),
                "elapsed": round(time.time() - j["started"], 2),
                "stages": j["stages"],
                "step": j["step"],
            },
            headers=SECURITY_HEADERS,
        )

    async def api_info(request: Request) -> Response:
        return JSONResponse(
            {"models": [model_info(n) for n in adapters], "limits": limits.__dict__}, headers=SECURITY_HEADERS
        )

    async def api_save(request: Request) -> Response:
        try:
            data = await read_json(request, limits)
            rid = data.get("id")
            live = st.results.get(rid) if isinstance(rid, str) else None
            if live is None:
                raise StreetlampError(
                    f"that result is no longer kept (the server keeps the last {limits.kept}); compute it again"
                )
            folder = st.runs_dir / f"live-{live.kind}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
            await asyncio.get_running_loop().run_in_executor(None, live.save, folder)
            return JSONResponse(
                {"folder": str(folder.resolve()), "report": str((folder / "report.html").resolve())},
                headers=SECURITY_HEADERS,
            )
        except TooLarge as e:
            return _err(413, str(e))
        except StreetlampError as e:
            return _err(400, str(e))
        except Exception as e:  # noqa: BLE001
            log.exception("save failed")
            return _err(500, f"could not save ({type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]})")

    async def not_found(request: Request, exc: Exception) -> Response:
        return _err(404, "no such page")

    async def not_allowed(request: Request, exc: Exception) -> Response:
        return _err(405, "method not allowed")

    routes = [
        Route("/", page),
        Route("/frame", frame),
        Route("/static/{name}", static),
        Route("/api/info", api_info),
        Route("/api/explain", api_explain, methods=["POST"]),
        Route("/api/edit", api_edit, methods=["POST"]),
        Route("/api/ablate", api_ablate, methods=["POST"]),
        Route("/api/pair", api_pair, methods=["POST"]),
        Route("/api/save", api_save, methods=["POST"]),
        Route("/api/progress/{job}", api_progress),
    ]
    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_allowed})
    app.state.serve = st
    app.add_middleware(Guard, token=token, hosts=hosts, origins=origins, cookie=f"streetlamp-token-{port}")
    return app


def new_token() -> str:
    return secrets.token_urlsafe(24)
