"""Names shared by the operator and the gateway's Kubernetes discovery (the gateway may not import the operator).

The operator stamps these labels and annotations on the engine pods it creates; the gateway reads them
back from EndpointSlices and InferenceServices. Plain constants only.
"""

from __future__ import annotations

GROUP = "fleetgate.io"
VERSION = "v1alpha1"
KIND = "InferenceService"
PLURAL = "inferenceservices"
API_VERSION = f"{GROUP}/{VERSION}"

ENGINE_PORT = 8000
ENGINE_PORT_NAME = "http"
# KV-cache events (spec.engine.kvEvents): the engine's ZMQ publisher and replay ports, named on the pod and the
# Service so that EndpointSlices carry them to the gateway's discovery.
KV_EVENTS_PORT_NAME = "kv-events"
KV_REPLAY_PORT_NAME = "kv-replay"
KV_EVENTS_DEFAULT_TOPIC = "kv"

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_PART_OF = "app.kubernetes.io/part-of"
LABEL_ISVC = "fleetgate.io/inferenceservice"
MANAGED_BY = "fleetgate"
ENGINE_NAME = "fleetgate-engine"

ANNOTATION_SPEC_HASH = "fleetgate.io/spec-hash"
ANNOTATION_SERVED_MODEL = "fleetgate.io/served-model"
# On an InferencePool whose engines publish KV-cache events: their topic (the ports are named on the pods)
ANNOTATION_KV_EVENTS_TOPIC = "fleetgate.io/kv-events-topic"

# Scale to zero: the gateway writes when a model was last asked for (at most once per
# `server.scale_from_zero.active_mark_s`); the operator writes the replica count it scaled down from, which
# the gateway restores when a request wakes the service.
ANNOTATION_LAST_REQUEST = "fleetgate.io/last-request"
ANNOTATION_WAKE_REPLICAS = "fleetgate.io/wake-replicas"
SPEC_SCALE_TO_ZERO_AFTER = "scaleToZeroAfterSeconds"

# The Gateway API Inference Extension's InferencePool (GA, v1): the operator publishes one per InferenceService
# when its CRD is installed; the Endpoint Picker's `inferencepool` discovery reads them.
POOL_GROUP = "inference.networking.k8s.io"
POOL_VERSION = "v1"
POOL_KIND = "InferencePool"
POOL_PLURAL = "inferencepools"
POOL_CRD = f"{POOL_PLURAL}.{POOL_GROUP}"
