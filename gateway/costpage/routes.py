"""Serve the cost page: GET /dashboard (HTML), /dashboard/app.js, /dashboard/style.css, /dashboard/config.json.

The page is static; it reads the usage API (`/v1/usage`, `/v1/usage/budgets`) from the browser with the
key the user types, so serving it needs no key. A strict Content-Security-Policy allows only this
origin's script, style and fetches (no inline script, no CDN), which also keeps a typed key from
leaving the page.
"""

from __future__ import annotations

from importlib import resources

import orjson
from fastapi import APIRouter
from fastapi.responses import Response

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
    "form-action 'none'; frame-ancestors 'none'; base-uri 'none'"
)
FILES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}


def _read(name: str) -> bytes:
    return resources.files("fleetgate.gateway.costpage").joinpath(name).read_bytes()


def costpage_router(*, auth_required: bool = True) -> APIRouter:
    """`auth_required` tells the page whether to ask for a key (False: local mode, auth off)."""
    path = "/dashboard"  # index.html refers to its assets under this path
    assets = {name: _read(name) for name in FILES}  # read once: the page never changes at run time
    headers = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache",
               "Referrer-Policy": "no-referrer"}
    router = APIRouter(tags=["cost page"])

    def serve(name: str) -> Response:
        return Response(assets[name], media_type=FILES[name], headers=headers)

    @router.get(path, include_in_schema=False)
    async def page() -> Response:
        return serve("index.html")

    @router.get(f"{path}/app.js", include_in_schema=False)
    async def script() -> Response:
        return serve("app.js")

    @router.get(f"{path}/style.css", include_in_schema=False)
    async def style() -> Response:
        return serve("style.css")

    config = orjson.dumps({"auth_required": auth_required})

    @router.get(f"{path}/config.json", include_in_schema=False)
    async def page_config() -> Response:
        return Response(config, media_type="application/json", headers=headers)

    return router
