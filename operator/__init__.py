"""The Kopf operator: InferenceService custom resources reconciled into vLLM engine pods.

Import as `fleetgate.operator` (this folder is mapped into the `fleetgate` root; a top-level
`operator` package would collide with the standard library). Kept free of Kopf at import time:
only `fleetgate.operator.handlers` imports Kopf.
"""
