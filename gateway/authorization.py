"""Authorizing what really serves a request, and keeping client-chosen model names out of bookkeeping.

A tenant's model list names what it may be served by, not only what it may ask for: an alias (`auto`)
that resolves to a concrete model, its fallbacks and its cascade target are each checked with the same
`Authenticator.authorize` as the requested name. The tier resolver already picks among the allowed
tiers (`TierResolver.resolve(allowed_models=...)`); this check holds for any resolver.

A requested name that was refused (403) or is unknown (404) is an arbitrary client string, up to the
body limit long: records, ledger rows and metric labels get a fixed placeholder instead
(`REFUSED_MODEL`, `UNKNOWN_MODEL`), and error messages quote at most `SHOWN_CHARS` of it.
"""

from __future__ import annotations

from fleetgate.core.errors import PermissionDeniedError
from fleetgate.gateway.stages import Authenticator, Tenant
from fleetgate.router.tiers.types import TierDecision

REFUSED_MODEL = "_refused"
UNKNOWN_MODEL = "_unknown"
SHOWN_CHARS = 64


def shown(name: str) -> str:
    """A client-given name for an error message: quoted, at most `SHOWN_CHARS` characters."""
    return repr(name if len(name) <= SHOWN_CHARS else name[:SHOWN_CHARS] + "...")


def _allowed(auth: Authenticator, tenant: Tenant, model: str) -> bool:
    try:
        auth.authorize(tenant, model)
    except PermissionDeniedError:
        return False
    return True


def authorized_decision(decision: TierDecision, *, tenant: Tenant, auth: Authenticator) -> TierDecision:
    """`decision` with only the models `tenant` may be served by: the first allowed of the chosen model and
    its fallbacks serves, the others stay fallbacks, a disallowed cascade target is dropped. 403 when none is
    allowed."""
    targets = [(decision.model, decision.tier), *decision.fallbacks]
    usable = [(m, t) for m, t in targets if _allowed(auth, tenant, m)]
    if not usable:
        raise PermissionDeniedError(
            f"tenant {tenant.id!r} may not use model {decision.model!r}"
            + (f" (chosen by alias {decision.alias!r})" if decision.alias else ""),
            param="model",
        )
    if len(usable) != len(targets):
        decision.model, decision.tier = usable[0]
        decision.fallbacks = [(m, t or "") for m, t in usable[1:]]
    if decision.escalate_to is not None and not _allowed(auth, tenant, decision.escalate_to):
        decision.escalate_to = decision.escalate_tier = None
    return decision
