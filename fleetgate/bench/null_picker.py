"""Null Endpoint Pickers and a time-stamped `fleetgate epp`: what `scripts/epp_idle_path.py` puts behind Envoy.

A null picker answers the ext_proc messages the way FleetGate's picker does (a fixed pick once the request body is
in, both bodies passed through, the response headers answered at once) and does nothing else: the protocol's own
cost on one transport. `aio` runs grpc.aio, the picker's own transport (`AIO_VARIANTS`: the same with other server
options or CPU placement); `sync` the synchronous grpcio server (a thread per stream); `grpclib` pure asyncio
HTTP/2 (no poller threads; the `grpclib` package, not a dependency of FleetGate: `pip install grpclib`). Each
time-stamps every message it reads and every answer it has written (`time.perf_counter`, CLOCK_MONOTONIC: one clock
with the measuring process) and appends one JSON line per request to its trace file, keyed by the request's
`x-bench-seq` header. `serve_traced_epp` runs the real picker with the same marks (its ext_proc servicer replaced by
a time-stamped copy of `server.ExternalProcessor.Process`).

    python -m fleetgate.bench.null_picker KIND PORT DEST TRACE      # KIND: an AIO_VARIANTS name, sync or grpclib
    python -m fleetgate.bench.null_picker epp CONFIG TRACE          # fleetgate epp --config CONFIG, time-stamped
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson

SEQ = "x-bench-seq"
EXT_PROC = "envoy.service.ext_proc.v3.ExternalProcessor"


class Marks:
    """One stream's time stamps: when each message was read (named by `name`) and each answer written; `save`
    appends them to the trace as one JSON line keyed by the request's `x-bench-seq` header."""

    def __init__(self) -> None:
        self.marks: dict[str, float] = {"open": time.perf_counter()}
        self.seq: str | None = None
        self._chunks = 0

    def name(self, req: Any) -> str:
        """The message's name in the trace: req_headers, req_body (its last piece), resp_headers, chunk1 (the
        first response-body chunk), chunk (the others)."""
        from fleetgate.gateway.epp import messages as m

        kind = req.WhichOneof("request")
        if kind == "request_headers":
            self.seq = m.header_map(req.request_headers).get(SEQ)
            return "req_headers"
        if kind == "request_body":
            return "req_body" if req.request_body.end_of_stream else "req_body_piece"
        if kind == "response_headers":
            return "resp_headers"
        if kind == "response_body":
            self._chunks += 1
            return "chunk1" if self._chunks == 1 else "chunk"
        return kind or "none"

    def mark(self, name: str) -> None:
        self.marks.setdefault(name, time.perf_counter())

    def save(self, trace: Path) -> None:
        if self.seq is not None:
            with trace.open("ab") as f:
                f.write(orjson.dumps({"seq": self.seq, **self.marks}) + b"\n")


class NullAnswers:
    """The picker's answers without its work: `dest` picked once the request body is in (the body passed through,
    its length set), the response headers answered at once and unchanged, every response chunk passed through."""

    def __init__(self, dest: str) -> None:
        self.dest = dest
        self._body: list[bytes] = []

    def answers(self, req: Any) -> list[Any]:
        from fleetgate.gateway.epp import messages as m

        kind = req.WhichOneof("request")
        if kind == "request_body":
            self._body.append(req.request_body.body)
            if not req.request_body.end_of_stream:
                return []
            raw = b"".join(self._body)
            return [m.route_to([self.dest], set_headers={"content-length": str(len(raw))}, remove=()),
                    *m.body_pieces(raw, response=False)]
        if kind == "response_headers":
            return [m.response_headers(set_headers={})]
        if kind == "response_body":
            return m.body_pieces(req.response_body.body, response=True, end=req.response_body.end_of_stream)
        return []


async def _answer(req: Any, marks: Marks, null: NullAnswers, send: Callable[[Any], Awaitable[None]]) -> None:
    """One message: marked as read, answered, each answer marked once written (`send` returned)."""
    name = marks.name(req)
    marks.mark(name)
    for i, resp in enumerate(null.answers(req)):
        await send(resp)
        marks.mark(f"{name}_w{i + 1}")


# The grpc.aio null pickers: their extra server options. `aio-im` sends the response's initial metadata as the stream
# opens (not with the first answer); `aio-pin` runs every thread of the process on one CPU (a message's hops
# between gRPC's threads and the event loop stay on one core); `aio-ra` posts the next read before it handles a
# message.
AIO_VARIANTS: dict[str, list[tuple[str, Any]]] = {
    "aio": [], "aio-im": [], "aio-lat": [("grpc.optimization_target", "latency")],
    "aio-nobdp": [("grpc.http2.bdp_probe", 0)], "aio-pin": [], "aio-ra": [],
}


async def serve_aio(port: int, dest: str, trace: Path, kind: str = "aio") -> None:
    if kind == "aio-pin":  # before gRPC starts its threads: they inherit it
        os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    import grpc
    from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
    from grpc_health.v1 import _async as health_async
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    class Null(ext_proc_grpc.ExternalProcessorServicer):
        async def Process(self, requests: Any, context: Any) -> None:
            marks, null = Marks(), NullAnswers(dest)
            if kind == "aio-im":
                await context.send_initial_metadata(())
            ahead: Any = None
            try:
                while True:
                    req = await (ahead if ahead is not None else context.read())
                    if req is grpc.aio.EOF:
                        return
                    if kind == "aio-ra":  # the next read posted before this message is handled
                        ahead = asyncio.ensure_future(context.read())
                    await _answer(req, marks, null, context.write)
            finally:
                if ahead is not None:
                    ahead.cancel()
                marks.save(trace)

    server = grpc.aio.server(options=[("grpc.so_reuseport", 0), *AIO_VARIANTS[kind]])
    ext_proc_grpc.add_ExternalProcessorServicer_to_server(Null(), server)
    health = health_async.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    for name in ("", EXT_PROC):
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination(timeout=3600)


def serve_sync(port: int, dest: str, trace: Path) -> None:
    """The grpcio synchronous server: a thread per stream, the handler a generator of answers."""
    from concurrent import futures

    import grpc
    from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    class Null(ext_proc_grpc.ExternalProcessorServicer):
        def Process(self, request_iterator: Any, context: Any) -> Any:
            marks, null = Marks(), NullAnswers(dest)
            try:
                for req in request_iterator:
                    name = marks.name(req)
                    marks.mark(name)
                    for i, resp in enumerate(null.answers(req)):
                        yield resp  # resumed once the server has sent it
                        marks.mark(f"{name}_w{i + 1}")
            finally:
                marks.save(trace)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), options=[("grpc.so_reuseport", 0)])
    ext_proc_grpc.add_ExternalProcessorServicer_to_server(Null(), server)
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    for name in ("", EXT_PROC):
        servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    server.wait_for_termination(timeout=3600)


async def serve_grpclib(port: int, dest: str, trace: Path) -> None:
    from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
    from grpclib.const import Cardinality, Handler
    from grpclib.health.service import Health
    from grpclib.server import Server

    class Null:
        async def Process(self, stream: Any) -> None:
            marks, null = Marks(), NullAnswers(dest)
            try:
                async for req in stream:
                    await _answer(req, marks, null, stream.send_message)
            finally:
                marks.save(trace)

        def __mapping__(self) -> dict[str, Handler]:
            return {f"/{EXT_PROC}/Process": Handler(self.Process, Cardinality.STREAM_STREAM, pb.ProcessingRequest,
                                                    pb.ProcessingResponse)}

    null = Null()
    server = Server([null, Health({null: []})])  # SERVING for the ext_proc service
    await server.start("127.0.0.1", port)
    await asyncio.sleep(3600)


def serve_traced_epp(config: str, trace: Path) -> None:
    """`fleetgate epp --config CONFIG`, its ext_proc loop time-stamping every message read, decided and answered: a
    copy of `server.ExternalProcessor.Process` (its expiry and drain left out) with the marks."""
    import grpc

    from fleetgate.gateway.epp import server
    from fleetgate.gateway.epp.exchange import Exchange
    from fleetgate.gateway.epp.lifetime import StreamLife

    class Traced(server.ExternalProcessor):
        async def Process(self, request_iterator: Any, context: Any) -> None:
            door = self._door
            life = StreamLife(door.settings.server.stream_deadline_s)
            exchange = Exchange(door, life)
            marks = Marks()
            try:
                async with life:
                    while not exchange.done:
                        req = await context.read()
                        if req is grpc.aio.EOF:
                            break
                        name = marks.name(req)
                        marks.mark(name)
                        out = await exchange.on_message(req)
                        marks.mark(f"{name}_decided")
                        for i, resp in enumerate(out):
                            await context.write(resp)
                            marks.mark(f"{name}_w{i + 1}")
            finally:
                exchange.close()
                marks.save(trace)

    server.ExternalProcessor = Traced  # type: ignore[misc]  # what EppServer.start serves
    server.run(argparse.Namespace(config=config, envoy_config=False, host=None, port=None, metrics_port=None))


def main(argv: list[str]) -> None:
    import uvloop

    if argv[0] == "epp":
        serve_traced_epp(argv[1], Path(argv[2]))
        return
    kind, port, dest, trace = argv[0], int(argv[1]), argv[2], Path(argv[3])
    if kind == "sync":
        serve_sync(port, dest, trace)
        return
    uvloop.run(serve_grpclib(port, dest, trace) if kind == "grpclib" else serve_aio(port, dest, trace, kind))


if __name__ == "__main__":
    main(sys.argv[1:])
