"""The InferenceService CRD, generated from the typed spec in `spec.py`.

Pydantic emits JSON Schema (draft 2020-12); a Kubernetes CRD wants a *structural* OpenAPI v3 schema.
`structural()` converts one into the other: `$ref`s are inlined, `Optional[X]` (`anyOf: [X, null]`) becomes
X (an absent field is how Kubernetes says "unset"), `const` becomes a one-value `enum`, numeric
`exclusiveMinimum/Maximum` become `minimum/maximum` plus the boolean flag, and `title`s are dropped. The
CEL rules declared on the models (`x-kubernetes-validations`) and the defaults pass through unchanged.
Status is open (`x-kubernetes-preserve-unknown-fields`) apart from the fields the printer columns and the
scale subresource read.
"""

from __future__ import annotations

from typing import Any

from fleetgate.operator.names import NAME_RULE
from fleetgate.operator.spec import GROUP, KIND, PLURAL, SHORT_NAMES, SINGULAR, VERSION, InferenceServiceSpec

CRD_NAME = f"{PLURAL}.{GROUP}"
_DROP = frozenset({"title", "$defs"})
# Rules on the whole object: only there can CEL see metadata.name. `fieldPath` makes the API server name
# the field in its refusal (without it the path reads `<nil>`).
ROOT_RULES: tuple[dict[str, str], ...] = (
    {"rule": NAME_RULE[0], "message": NAME_RULE[1], "fieldPath": ".metadata.name", "reason": "FieldValueInvalid"},
    {
        "rule": "!has(self.spec.adapters) || has(self.spec.model.servedName) "
        "|| self.spec.adapters.all(a, a.name != self.metadata.name)",
        "message": "an adapter name must differ from metadata.name, the served model's name when "
        "model.servedName is unset",
        "fieldPath": ".spec.adapters",
        "reason": "FieldValueInvalid",
    },
)


def structural(schema: dict[str, Any], *, defs: dict[str, Any] | None = None) -> dict[str, Any]:
    """Convert one pydantic JSON-schema node (and its children) to a structural OpenAPI v3 node."""
    defs = schema.get("$defs", {}) if defs is None else defs
    if "$ref" in schema:
        target = defs[schema["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
        return structural(merged, defs=defs)
    if "anyOf" in schema:
        branches = [b for b in schema["anyOf"] if b.get("type") != "null"]
        if len(branches) != 1:
            raise ValueError(f"cannot express anyOf with {len(branches)} non-null branches structurally")
        rest = {k: v for k, v in schema.items() if k != "anyOf"}
        if rest.get("default", ...) is None:
            del rest["default"]
        return structural({**branches[0], **rest}, defs=defs)
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _DROP:
            continue
        if key == "properties":
            out[key] = {name: structural(prop, defs=defs) for name, prop in value.items()}
        elif key == "items" or (key == "additionalProperties" and isinstance(value, dict)):
            out[key] = structural(value, defs=defs)
        elif key == "const":
            out["enum"] = [value]
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "default" and value is None:
            continue
        else:
            out[key] = value
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    if out.get("type") == "object" and "properties" in out and not out.get("additionalProperties", True):
        del out["additionalProperties"]  # structural schemas prune unknown fields by default
    return out


def spec_schema() -> dict[str, Any]:
    return structural(InferenceServiceSpec.model_json_schema(by_alias=True, mode="validation"))


def status_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
        "properties": {
            "phase": {"type": "string"},
            "ready": {"type": "string", "description": "readyReplicas/replicas, for kubectl get"},
            "replicas": {"type": "integer"},
            "readyReplicas": {"type": "integer"},
            "selector": {"type": "string"},
            "observedGeneration": {"type": "integer", "format": "int64"},
            "endpoint": {"type": "string"},
            "servedModel": {"type": "string"},
            "conditions": {
                "type": "array",
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["type"],
                "items": {
                    "type": "object",
                    "required": ["type", "status"],
                    "properties": {
                        "type": {"type": "string"},
                        "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                        "reason": {"type": "string"},
                        "message": {"type": "string"},
                        "lastTransitionTime": {"type": "string", "format": "date-time"},
                        "observedGeneration": {"type": "integer", "format": "int64"},
                    },
                },
            },
        },
    }


def build_crd() -> dict[str, Any]:
    """The full CustomResourceDefinition manifest (a plain dict, ready for YAML)."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME, "labels": {"app.kubernetes.io/part-of": "fleetgate"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": ["fleetgate"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "A model served by vLLM engine pods, planned and reconciled by FleetGate.",
                            "required": ["spec"],
                            # Children take this name: refuse names a Service or label value cannot have.
                            "x-kubernetes-validations": [dict(rule) for rule in ROOT_RULES],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                # `name` declared so that fieldPath .metadata.name resolves.
                                "metadata": {"type": "object", "properties": {"name": {"type": "string"}}},
                                "spec": spec_schema(),
                                "status": status_schema(),
                            },
                        }
                    },
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": [
                        {"name": "Model", "type": "string", "jsonPath": ".status.servedModel"},
                        {"name": "Ready", "type": "string", "jsonPath": ".status.ready"},
                        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                        {"name": "Accelerator", "type": "string", "jsonPath": ".spec.resources.accelerator",
                         "priority": 1},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                }
            ],
        },
    }  # fmt: skip


def to_yaml(crd: dict[str, Any]) -> str:
    import yaml

    class _NoAliases(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:
            return True

    header = "# Generated by `fleetgate crd` from fleetgate/operator/spec.py. Do not edit by hand.\n"
    return header + yaml.dump(crd, Dumper=_NoAliases, sort_keys=False, width=120)


def build_peering_crds() -> list[dict[str, Any]]:
    """Kopf's peering CRDs (kopf.dev/v1): operator replicas register there so only one reconciles."""
    crds = []
    for kind, scope in (("ClusterKopfPeering", "Cluster"), ("KopfPeering", "Namespaced")):
        plural = kind.lower() + "s"
        crds.append(
            {
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": {"name": f"{plural}.kopf.dev"},
                "spec": {
                    "scope": scope,
                    "group": "kopf.dev",
                    "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
                    "versions": [
                        {
                            "name": "v1",
                            "served": True,
                            "storage": True,
                            "schema": {
                                "openAPIV3Schema": {
                                    "type": "object",
                                    "properties": {
                                        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                                    },
                                }
                            },
                        }
                    ],
                },
            }
        )
    return crds


def peering_object(*, name: str = "fleetgate", namespace: str | None = None) -> dict[str, Any]:
    """The peering object `fleetgate operator --peering NAME` joins (cluster-wide unless a namespace is given)."""
    if namespace is None:
        return {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": name}}
    return {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": name, "namespace": namespace}}


def peering_yaml() -> str:
    import yaml

    header = "# Generated by `fleetgate crd --peering` (Kopf's peering CRDs). Do not edit by hand.\n"
    return header + yaml.safe_dump_all(build_peering_crds(), sort_keys=False, width=120)
