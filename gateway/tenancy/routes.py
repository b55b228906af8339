"""The usage API: a tenant reads its own usage and budgets, the admin reads everyone's.

GET /v1/usage?start=YYYY-MM-DD&end=YYYY-MM-DD[&tenant=ID][&format=csv]
    totals, and totals by day, tenant, model, base and tier, plus the (day, tenant, model, tier) rows; a LoRA
    adapter's rows and model totals carry its `base` model ("" for others).
    Defaults: the 30 days ending today (UTC). `tenant` filters (admin only).
GET /v1/usage/budgets
    each visible tenant's configured limits and current use (settled + in flight) of each window.
Errors are OpenAI-shaped (`fleetgate.core.errors`), rendered here so the router works in any app.
With `auth: disabled` (local mode) the caller is treated as the admin.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from fleetgate.core.errors import FleetGateError, PermissionDeniedError
from fleetgate.core.kvstore import StoreUnavailableError
from fleetgate.gateway.context import request_id_from
from fleetgate.gateway.stages import ANONYMOUS, Tenant
from fleetgate.gateway.tenancy.report import day_range, usage_csv, usage_json
from fleetgate.gateway.tenancy.stage import TenancyStage


def error_response(exc: FleetGateError, *, request_id: str | None = None) -> JSONResponse:
    headers = dict(exc.headers)
    if request_id is not None:
        headers["x-request-id"] = request_id
    return JSONResponse(exc.to_openai(), status_code=exc.status, headers=headers)


def _unavailable(what: str, exc: Exception, request_id: str) -> JSONResponse:
    error = FleetGateError(f"{what} unavailable: {exc}", code="store_unavailable")
    error.status = 503
    return error_response(error, request_id=request_id)


def _sees_all(tenant: Tenant) -> bool:
    return tenant.is_admin or tenant is ANONYMOUS


def usage_router(*, tenancy: TenancyStage) -> APIRouter:
    router = APIRouter(tags=["usage"])

    async def caller(authorization: str | None, wanted: str | None) -> tuple[Tenant, str | None]:
        tenant = await tenancy.authenticator.authenticate(authorization)
        if _sees_all(tenant):
            return tenant, wanted
        if wanted is not None and wanted != tenant.id:
            raise PermissionDeniedError("a tenant key may only read its own usage", param="tenant",
                                        code="forbidden")
        return tenant, tenant.id

    @router.get("/v1/usage", response_model=None)
    async def usage(
        request: Request,
        start: str | None = Query(default=None),
        end: str | None = Query(default=None),
        tenant: str | None = Query(default=None),
        format: str = Query(default="json", pattern="^(json|csv)$"),
        authorization: str | None = Header(default=None),
    ) -> Response:
        rid = request_id_from(request.headers)
        try:
            _, scope = await caller(authorization, tenant)
            days = day_range(start=start, end=end, today=datetime.now(UTC).date())
            rows = await tenancy.ledger.read(days=days, tenant=scope)
        except FleetGateError as exc:
            return error_response(exc, request_id=rid)
        except StoreUnavailableError as exc:
            return _unavailable("usage store", exc, rid)
        if format == "csv":
            return PlainTextResponse(usage_csv(rows, adapters=tenancy.prices.adapters()), media_type="text/csv",
                                     headers={"Content-Disposition": 'attachment; filename="usage.csv"',
                                              "x-request-id": rid})
        report = usage_json(rows, days=days, scope=scope or "all", adapters=tenancy.prices.adapters())
        return JSONResponse(report, headers={"x-request-id": rid})

    @router.get("/v1/usage/budgets", response_model=None)
    async def budgets(request: Request, authorization: str | None = Header(default=None)) -> Response:
        rid = request_id_from(request.headers)
        try:
            who, scope = await caller(authorization, None)
        except FleetGateError as exc:
            return error_response(exc, request_id=rid)
        ids = [scope] if scope is not None else [t.id for t in tenancy.config.tenants]
        data: list[dict[str, Any]] = []
        try:
            for tid in ids:
                cfg = tenancy.config.tenant(tid)
                data.append({
                    "tenant": tid,
                    "name": (cfg.name or tid) if cfg else tid,
                    "daily_budget_usd": float(cfg.daily_budget_usd) if cfg and cfg.daily_budget_usd else None,
                    "monthly_budget_usd": float(cfg.monthly_budget_usd) if cfg and cfg.monthly_budget_usd else None,
                    "rpm": cfg.rpm if cfg else None,
                    "tpm": cfg.tpm if cfg else None,
                    "windows": await tenancy.limiter.status(tid),
                })
        except StoreUnavailableError as exc:
            return _unavailable("limits store", exc, rid)
        return JSONResponse({"object": "list", "scope": scope or "all", "as_of": int(time.time()), "data": data,
                             "caller": {"tenant": who.id, "admin": _sees_all(who)}}, headers={"x-request-id": rid})

    return router
