"""Authorizing what really serves a request, and keeping client-chosen model names out of bookkeeping.

A tenant's model list names what it may be served by, not only what it may ask for: an alias (`auto`)
that resolves to a concrete model, its fallbacks and its cascade target are each checked with the same
`Authenticator.authorize` as the requested name. The tier resolver already picks among the allowed
tiers (`TierResolver.resolve(allowed_models=...)`); this check holds for any resolver.

A requested name that was refused (403) or is unknown (404) is an arbitrary client string, up to the
body limit long: records, ledger rows and metric labels get a fixed placeholder instead
(`REFUSED_MODEL`, `UNKNOWN_MODEL`), and error messages quote at most `SHOWN_CHARS` of it.

A LoRA adapter is a model name like any other for the tenant's list; an adapter that names `tenants` is
private to them: to every other tenant it does not exist (`visible_to`), and a request for it gets exactly
the 404 of an unknown name (same message, same listing, same `_unknown` record), so another tenant's
private adapter cannot be confirmed by name. Inside the gateway (tier targets, `authorize_model`) it is
simply not allowed.
"""

from __future__ import annotations

from fleetgate.core.errors import NotFoundError, PermissionDeniedError
from fleetgate.gateway.discovery import EndpointSource, adapter_named
from fleetgate.gateway.stages import Authenticator, Tenant
from fleetgate.router.tiers.types import TierDecision

REFUSED_MODEL = "_refused"
UNKNOWN_MODEL = "_unknown"
SHOWN_CHARS = 64


def shown(name: str) -> str:
    """A client-given name for an error message: quoted, at most `SHOWN_CHARS` characters."""
    return repr(name if len(name) <= SHOWN_CHARS else name[:SHOWN_CHARS] + "...")


def visible_to(tenant: Tenant, model: str, *, source: EndpointSource | None) -> bool:
    """False for an adapter restricted to other tenants: for `tenant` it does not exist."""
    spec = adapter_named(source, model) if source is not None else None
    return spec is None or not spec.tenants or tenant.id in spec.tenants


def unknown_model(model: str, *, names: list[str]) -> NotFoundError:
    """The one answer for a name that is not served *to this tenant*: unknown, or another tenant's adapter.
    `names`: what this tenant may ask for."""
    listed = ", ".join(names) or "(none configured)"
    return NotFoundError(f"model {shown(model)} does not exist; available models: {listed}", param="model")


def authorize_model(auth: Authenticator, tenant: Tenant, model: str, *, source: EndpointSource | None) -> None:
    """403 unless `tenant` may use `model`: its models list allows it and, for an adapter restricted to some
    tenants, it is one of them."""
    auth.authorize(tenant, model)
    if not visible_to(tenant, model, source=source):
        raise PermissionDeniedError(f"tenant {tenant.id!r} may not use model {shown(model)}", param="model")


def _allowed(auth: Authenticator, tenant: Tenant, model: str, source: EndpointSource | None) -> bool:
    try:
        authorize_model(auth, tenant, model, source=source)
    except PermissionDeniedError:
        return False
    return True


def authorized_decision(
    decision: TierDecision, *, tenant: Tenant, auth: Authenticator, source: EndpointSource | None = None
) -> TierDecision:
    """`decision` with only the models `tenant` may be served by: the first allowed of the chosen model and
    its fallbacks serves, the others stay fallbacks, a disallowed cascade target is dropped. 403 when none is
    allowed."""
    targets = [(decision.model, decision.tier), *decision.fallbacks]
    usable = [(m, t) for m, t in targets if _allowed(auth, tenant, m, source)]
    if not usable:
        raise PermissionDeniedError(
            f"tenant {tenant.id!r} may not use model {decision.model!r}"
            + (f" (chosen by alias {decision.alias!r})" if decision.alias else ""),
            param="model",
        )
    if len(usable) != len(targets):
        decision.model, decision.tier = usable[0]
        decision.fallbacks = [(m, t or "") for m, t in usable[1:]]
    if decision.escalate_to is not None and not _allowed(auth, tenant, decision.escalate_to, source):
        decision.escalate_to = decision.escalate_tier = None
    return decision
