"""A plain Envoy bootstrap that routes through FleetGate's Endpoint Picker (`fleetgate epp --envoy-config`).

What a Gateway API implementation (Istio, Envoy Gateway, ...) builds from an `InferencePool`, written out for a
bare Envoy: the tests and `fleetgate bench gateway` run exactly this, and it is a working starting point for a
hand-run proxy. Filters, in order:
1. `lua` guard: a client's own `x-gateway-destination-endpoint` is removed (and the route chosen again), so
   it can never choose the pod (with FailOpen, a picker that is down would otherwise leave the client's
   choice in place);
2. `ext_proc` to the EPP: headers SEND, both bodies FULL_DUPLEX_STREAMED (as the llm-d router runs), the
   `envoy.lb` namespaces forwarded (a subset hint) and accepted back (the pick); the endpoint that served is
   sent as the `upstream.address` attribute on the response path (a Gateway API implementation says it in
   `envoy.lb` metadata instead; the picker reads either), and `response.flags`, so the picker tells Envoy's own
   connect failure (UF: the pod is unreachable, ejected as the gateway ejects it) from an engine's 503;
   `failure_mode_allow` is the pool's `failureMode`
   (FailOpen: true). The picker's cluster is health-checked over gRPC (Envoy fails open only before the
   first body chunk went to the picker, so a picker that is down must be known before a request needs it);
3. `router`.
Envoy's own failures (connect errors, upstream resets) answer with an OpenAI-shaped error body.
Routes: with the destination header, the `ORIGINAL_DST` cluster (`use_http_header`; it reads one `ip:port`,
hence `epp.max_endpoints: 1` for plain Envoy); without it (the EPP failed and the pool fails open), the pool's
endpoints round-robin; with FailClose, 503.
"""

from __future__ import annotations

from typing import Any, Literal

import yaml

from fleetgate.gateway.epp.messages import (
    DESTINATION,
    LB_NAMESPACE,
    RESPONSE_FLAGS,
    SUBSET_NAMESPACE,
    UPSTREAM_ADDRESS,
)

FailureMode = Literal["FailOpen", "FailClose"]

# Envoy's own failures (no healthy upstream, connect failure, upstream reset or timeout, protocol error, ...): their
# local replies get an OpenAI-shaped body; the picker's own answers (ImmediateResponses) carry no such flag.
PROXY_FAILURES = ("UH", "UF", "UO", "NR", "URX", "UC", "UT", "UPE", "UMSDR", "NC", "DT")
EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
_T = "type.googleapis.com/envoy.extensions"

GUARD_LUA = f"""\
function envoy_on_request(handle)
  local headers = handle:headers()
  if headers:get("{DESTINATION}") ~= nil then
    headers:remove("{DESTINATION}")
    handle:clearRouteCache()
  end
end
"""


def _address(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


def _cluster(name: str, endpoints: list[tuple[str, int]], *, http2: bool = False,
             health_interval_s: float | None = None) -> dict[str, Any]:
    cluster: dict[str, Any] = {
        "name": name,
        "type": "STATIC" if all(h.replace(".", "").isdigit() for h, _ in endpoints) else "STRICT_DNS",
        "connect_timeout": "2s",
        "load_assignment": {"cluster_name": name, "endpoints": [
            {"lb_endpoints": [{"endpoint": {"address": _address(h, p)}} for h, p in endpoints]}]},
    }
    if http2:
        cluster["typed_extension_protocol_options"] = {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": f"{_T}.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}}}}
    if health_interval_s is not None:
        # The picker's gRPC health: a picker that is down is known before a request needs it, so a FailOpen
        # pool fails open at once (Envoy fails open only before the first body chunk went to the picker), and
        # no panic mode sends requests to it anyway.
        # `no_traffic_interval` too: Envoy checks a cluster that has carried no request yet only every 60 s by
        # default, so a picker that starts (or restarts after a drain) after Envoy would be unused for a minute.
        every = f"{health_interval_s}s"
        cluster["health_checks"] = [{"timeout": "1s", "interval": every, "no_traffic_interval": every,
                                     "no_traffic_healthy_interval": every, "unhealthy_threshold": 1,
                                     "healthy_threshold": 1, "reuse_connection": True,
                                     "grpc_health_check": {"service_name": EXT_PROC_SERVICE}}]
        cluster["common_lb_config"] = {"healthy_panic_threshold": {"value": 0}}
    return cluster


def envoy_config(
    *,
    listen: tuple[str, int],
    epp: tuple[str, int],
    pool: list[tuple[str, int]],
    failure_mode: FailureMode = "FailClose",
    admin: tuple[str, int] | None = None,
    message_timeout_s: float = 30.0,
    stream_idle_timeout_s: float = 300.0,
    health_interval_s: float = 1.0,
) -> dict[str, Any]:
    """The bootstrap as a dict: `listen` the client address, `epp` the picker's gRPC address, `pool` the
    endpoints (FailOpen routes to them when the picker cannot be asked)."""
    fail_open = failure_mode == "FailOpen"
    with_pick = {"match": {"prefix": "/", "headers": [{"name": DESTINATION, "present_match": True}]},
                 "route": {"cluster": "original_dst", "timeout": "0s", "idle_timeout": f"{stream_idle_timeout_s}s"}}
    without = ({"match": {"prefix": "/"}, "route": {"cluster": "pool", "timeout": "0s",
                                                     "idle_timeout": f"{stream_idle_timeout_s}s"}}
               if fail_open else
               {"match": {"prefix": "/"}, "direct_response": {"status": 503, "body": {
                   "inline_string": '{"error": {"message": "no endpoint was picked for this request", '
                                    '"type": "server_error", "param": null, "code": "upstream_unavailable"}}'}}})
    filters = [
        {"name": "fleetgate.guard", "typed_config": {
            "@type": f"{_T}.filters.http.lua.v3.Lua", "default_source_code": {"inline_string": GUARD_LUA}}},
        {"name": "envoy.filters.http.ext_proc", "typed_config": {
            "@type": f"{_T}.filters.http.ext_proc.v3.ExternalProcessor",
            "grpc_service": {"envoy_grpc": {"cluster_name": "epp"}, "timeout": f"{message_timeout_s}s"},
            "failure_mode_allow": fail_open,
            "message_timeout": f"{message_timeout_s}s",
            "processing_mode": {"request_header_mode": "SEND", "response_header_mode": "SEND",
                                "request_body_mode": "FULL_DUPLEX_STREAMED",
                                "response_body_mode": "FULL_DUPLEX_STREAMED",
                                "request_trailer_mode": "SEND", "response_trailer_mode": "SEND"},
            "metadata_options": {"forwarding_namespaces": {"untyped": [LB_NAMESPACE, SUBSET_NAMESPACE]},
                                 "receiving_namespaces": {"untyped": [LB_NAMESPACE]}},
            "response_attributes": [UPSTREAM_ADDRESS, RESPONSE_FLAGS]}},
        {"name": "envoy.filters.http.router", "typed_config": {
            "@type": f"{_T}.filters.http.router.v3.Router", "suppress_envoy_headers": True}},
    ]
    hcm = {
        "@type": f"{_T}.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "inference",
        "route_config": {"virtual_hosts": [{
            "name": "inference", "domains": ["*"], "routes": [with_pick, without]}]},
        "http_filters": filters,
        "local_reply_config": {"mappers": [{
            "filter": {"response_flag_filter": {"flags": list(PROXY_FAILURES)}},
            "body_format_override": {"json_format": {"error": {
                "message": "the proxy could not complete the request: %LOCAL_REPLY_BODY%", "type": "server_error",
                "param": None, "code": "proxy_error"}}}}]},
    }
    clusters = [
        {"name": "original_dst", "type": "ORIGINAL_DST", "lb_policy": "CLUSTER_PROVIDED", "connect_timeout": "2s",
         "original_dst_lb_config": {"use_http_header": True, "http_header_name": DESTINATION}},
        _cluster("epp", [epp], http2=True, health_interval_s=health_interval_s),
    ]
    if fail_open:
        clusters.append(_cluster("pool", pool))
    config: dict[str, Any] = {"static_resources": {
        "listeners": [{"name": "inference", "address": _address(*listen), "filter_chains": [
            {"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]}]}],
        "clusters": clusters}}
    if admin is not None:
        config["admin"] = {"address": _address(*admin)}
    return config


def envoy_yaml(**kwargs: Any) -> str:
    return yaml.safe_dump(envoy_config(**kwargs), sort_keys=False)
