"""FleetGate: a Kubernetes-native LLM gateway and fleet operator.

One import root. The top-level folders of the repository are mapped into it by setuptools:
`fleetgate.operator` (operator/), `fleetgate.gateway` (gateway/), `fleetgate.router` (router/),
`fleetgate.cache` (cache/), `fleetgate.engine_image` (engine_image/). This folder holds the CLI,
the local stack, the engine simulator, benchmarks and the shared kernel (`fleetgate.core`).
"""

__version__ = "0.1.0"
