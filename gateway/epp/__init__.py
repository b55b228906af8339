"""FleetGate's second front door: the Endpoint Picker (EPP) of the Gateway API Inference Extension.

Any conformant inference gateway (Envoy, Istio, Envoy Gateway, NGINX Gateway Fabric, agentgateway, GKE) asks
the EPP of an `InferencePool` which pod serves each request, over Envoy's ext_proc protocol. FleetGate's EPP
drives the same stages as its own HTTP gateway (`fleetgate.gateway.flow`: auth, limits and budgets, cache,
tier, pick, settle); only the framing differs. Modules: `messages` (the protocol's protobufs), `exchange`
(one request's messages), `answer` (the response path), `server` (gRPC, health, `fleetgate epp`).
"""
