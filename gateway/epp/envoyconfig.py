"""A plain Envoy bootstrap that routes through FleetGate's Endpoint Picker (`fleetgate epp --envoy-config`).

What a Gateway API implementation (Istio, Envoy Gateway, ...) builds from an `InferencePool`, written out for a
bare Envoy: the tests and `fleetgate bench gateway` run exactly this, and it is a working starting point for a
hand-run proxy. Filters, in order:
1. `lua` guard: a client's own `x-gateway-destination-endpoint` is removed (and the route chosen again), so
   it can never choose the pod (with FailOpen, a picker that is down would otherwise leave the client's
   choice in place);
2. `ext_proc` to the EPP: headers SEND, both bodies FULL_DUPLEX_STREAMED (as the llm-d router runs), the
   `envoy.lb` namespace forwarded (the served endpoint) and accepted back (the pick); `failure_mode_allow` is
   the pool's `failureMode` (FailOpen: true);
3. `lua`: on the response, the upstream host (put in a header by the route, `%UPSTREAM_HOST%`, and removed
   here) becomes `envoy.lb` metadata `x-gateway-destination-endpoint-served`, which ext_proc then sends
   the EPP, as the protocol's data plane must (Envoy's Lua API has no accessor for the upstream host);
4. `router`.
Routes: with the destination header, the `ORIGINAL_DST` cluster (`use_http_header`; it reads one `ip:port`,
hence `epp.max_endpoints: 1` for plain Envoy); without it (the EPP failed and the pool fails open), the pool's
endpoints round-robin; with FailClose, 503.
"""

from __future__ import annotations

from typing import Any, Literal

import yaml

from fleetgate.gateway.epp.messages import DESTINATION, LB_NAMESPACE, SUBSET_NAMESPACE

FailureMode = Literal["FailOpen", "FailClose"]
UPSTREAM_HOST = "x-fleetgate-upstream-host"
EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
_T = "type.googleapis.com/envoy.extensions"

GUARD_LUA = f"""\
function envoy_on_request(handle)
  local headers = handle:headers()
  if headers:get("{DESTINATION}") ~= nil or headers:get("{UPSTREAM_HOST}") ~= nil then
    headers:remove("{DESTINATION}")
    headers:remove("{UPSTREAM_HOST}")
    handle:clearRouteCache()
  end
end
"""

SERVED_LUA = f"""\
function envoy_on_response(handle)
  local host = handle:headers():get("{UPSTREAM_HOST}")
  if host ~= nil then
    handle:headers():remove("{UPSTREAM_HOST}")
    handle:streamInfo():dynamicMetadata():set("{LB_NAMESPACE}", "{DESTINATION}-served", host)
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
        cluster["health_checks"] = [{"timeout": "1s", "interval": f"{health_interval_s}s", "unhealthy_threshold": 1,
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
                                 "receiving_namespaces": {"untyped": [LB_NAMESPACE]}}}},
        {"name": "fleetgate.served", "typed_config": {
            "@type": f"{_T}.filters.http.lua.v3.Lua", "default_source_code": {"inline_string": SERVED_LUA}}},
        {"name": "envoy.filters.http.router", "typed_config": {
            "@type": f"{_T}.filters.http.router.v3.Router", "suppress_envoy_headers": True}},
    ]
    hcm = {
        "@type": f"{_T}.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "inference",
        "route_config": {"virtual_hosts": [{
            "name": "inference", "domains": ["*"], "routes": [with_pick, without],
            "response_headers_to_add": [{"header": {"key": UPSTREAM_HOST, "value": "%UPSTREAM_HOST%"}}]}]},
        "http_filters": filters,
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
