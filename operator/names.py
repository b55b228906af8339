"""Which InferenceService names can name its children. Pure.

The Service, Deployment, PDB and autoscaler take the InferenceService's own name, and the name is the
value of the selector label `app.kubernetes.io/instance`. A Service name must be a DNS-1035 label
(lower-case letters, digits and '-', starting with a letter, ending alphanumeric, at most 63 characters),
and a label value at most 63 characters, so the InferenceService name must be one too. The CRD refuses
other names with a CEL rule on `metadata.name` (`NAME_RULE`); the operator checks the same rule, for
API servers that do not enforce CEL and objects created before the rule existed.
"""

from __future__ import annotations

import re

MAX_NAME = 63
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
NAME_RULE = (
    "self.metadata.name.size() <= 63 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
    "metadata.name must be a DNS-1035 label (lower-case letters, digits and '-', starting with a letter, "
    "at most 63 characters): it names the engine Service and its selector label",
)


def name_problem(name: str) -> str | None:
    """Why `name` cannot name the children, or None when it can."""
    if len(name) > MAX_NAME:
        return (
            f"metadata.name {name!r} has {len(name)} characters: at most {MAX_NAME}, because it names the engine "
            "Service and is the value of its selector label"
        )
    if not _DNS_1035.match(name):
        return (
            f"metadata.name {name!r} is not a DNS-1035 label (lower-case letters, digits and '-', starting with a "
            "letter, no dots): it names the engine Service"
        )
    return None
