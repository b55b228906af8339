"""The engine's answer as it passes back through the proxy: rewritten, charged and recorded as the gateway does.

The proxy hands the Endpoint Picker the response headers and then every body chunk (FULL_DUPLEX_STREAMED);
the picker decides what the client gets. One of five modes, chosen at the response headers:
- `relay` (the client streams, the engine answered 200): each chunk goes through `sse.SseRewriter` (usage
  kept only where the client asked, the served model's name, clean error events, the reservation's completion
  cap: an engine generating past `max_tokens` is cut off there and charged no more) and back at once; a
  stream that ends without `[DONE]` gets the gateway's error event. Usage comes from the engine's own chunks: the
  picker asked for usage on every chunk (`forwarding.upstream_body`), so a client who leaves is charged up to
  the last chunk that reached the picker.
- `assemble` (the client does not stream, so the picker asked the engine to stream, as the gateway does):
  chunks are collected and assembled; the client gets the complete JSON answer at the end, or the gateway's
  502/504 error when the engine broke off.
- `plain` (a non-streaming request the gateway does not assemble: tools, logprobs, best_of): the engine's
  JSON, checked, its usage charged, the model name rewritten where it differs.
- `refused` (the engine answered an error status): the error body is collected and answered the way the
  gateway answers it (`errors.from_engine`: safe messages only, Retry-After kept), nothing charged.
- `unreached` (the proxy could not connect to the endpoint: its own 503, `messages.connect_failed`): the
  endpoint is ejected at once (`scheduler.on_connect_error`, the gateway's back-off), and the client gets the
  gateway's 503 for an engine it cannot reach in place of the proxy's body. It goes back as a header and body
  mutation, not an ImmediateResponse: Envoy would pass a local reply of a stream flagged UF through its
  `local_reply_config` a second time.
Headers of a buffered answer go out with its body at the end (the proxy holds the client until then), so an
answer that fails late is still a clean error with the right status. `abandon` ends an answer the client
left: the engine's work so far is charged and the request recorded as 499; `interrupt` ends one whose time is
up (`lifetime`): a relayed stream with an error event and `[DONE]`, a buffered answer with the 504 or 503.
"""

from __future__ import annotations

from functools import partial
from typing import Literal

import orjson

from fleetgate.cache.types import CacheStatus
from fleetgate.core.errors import FleetGateError, UpstreamBadResponseError
from fleetgate.core.types import Usage
from fleetgate.gateway.assembly import StreamAssembler
from fleetgate.gateway.collect import answer_of, capped
from fleetgate.gateway.context import Attempt, RequestContext
from fleetgate.gateway.engine_usage import fallback_usage, parse_usage
from fleetgate.gateway.epp import messages
from fleetgate.gateway.epp.lifetime import Ending
from fleetgate.gateway.errors import from_engine
from fleetgate.gateway.flow import Flow
from fleetgate.gateway.parsing import ParsedRequest
from fleetgate.gateway.sse import SseRewriter

Mode = Literal["relay", "assemble", "plain", "refused", "unreached"]
MAX_BUFFERED = 64 * 1024 * 1024  # a non-streaming answer bigger than this is an engine fault, not an answer


class Answer:
    def __init__(
        self, *, flow: Flow, ctx: RequestContext, attempt: Attempt, status: int, retry_after: str | None,
        assembled_upstream: bool, served_header: dict[str, str], unreached: FleetGateError | None = None,
    ) -> None:
        """`unreached`: the proxy could not connect to the endpoint; the error the client gets instead."""
        parsed = ctx.parsed
        assert parsed is not None
        self._flow = flow
        self._ctx = ctx
        self._parsed: ParsedRequest = parsed
        self._attempt = attempt
        self._status = status
        self._retry_after = retry_after
        self._extra = served_header
        self._buf: list[bytes] = []
        self._size = 0
        self.done = False
        self._completed = False  # the scheduler was told the engine call is over
        self._unreached = unreached
        ep = attempt.endpoint
        renamed = attempt.model if ep.model != attempt.model else None
        first_token = partial(flow.stages.scheduler.on_first_token, attempt.routing, ep)
        self.mode: Mode
        self._rw: SseRewriter | None = None
        if unreached is not None:
            self.mode = "unreached"
            self._extra = {}  # no endpoint served it
            self._complete(ok=False, usage=None)
            flow.stages.scheduler.on_connect_error(ep)
            flow.metrics.upstream_errors.labels(attempt.model, ep.id, "connect").inc()
        elif status != 200:
            self.mode = "refused"
        elif parsed.stream:
            self.mode = "relay"
            miss = ctx.lookup is not None and ctx.lookup.status == CacheStatus.MISS
            self._rw = SseRewriter(endpoint_id=ep.id, include_usage=parsed.include_usage,
                                   continuous_usage=parsed.continuous_usage, model_name=renamed,
                                   assembler=StreamAssembler(parsed.kind) if miss else None,
                                   completion_cap=ctx.completion_cap, on_first_token=first_token)
        elif assembled_upstream:
            self.mode = "assemble"
            self._rw = SseRewriter(endpoint_id=ep.id, include_usage=False, continuous_usage=False, model_name=None,
                                   assembler=StreamAssembler(parsed.kind), collect_only=True,
                                   completion_cap=ctx.completion_cap, on_first_token=first_token)
        else:
            self.mode = "plain"

    def headers(self) -> list[messages.ProcessingResponse]:
        """The answer to the response headers: now for a relayed stream, at the end for a buffered answer."""
        if self.mode != "relay":
            return []
        headers = {**self._flow.headers(self._ctx, self._attempt), **self._extra}
        return [messages.response_headers(set_headers=headers, remove=("content-length",))]

    def body(self, chunk: bytes, *, end: bool) -> list[messages.ProcessingResponse]:
        """One response-body chunk from the proxy; what goes back (the whole answer once `end`)."""
        if self.done:
            return []
        if self.mode == "relay":
            return self._relay(chunk, end=end)
        if self.mode == "unreached":  # the proxy's own error body: replaced at its end
            return self._replaced(self._unreached) if end and self._unreached is not None else []
        if self._rw is not None:
            self._rw.feed(chunk)
        else:
            self._size += len(chunk)
            if self._size > MAX_BUFFERED:
                return self._fail(UpstreamBadResponseError("the engine's answer is too large to be a completion"))
            self._buf.append(chunk)
        if not end:
            return []
        return self._finish_buffered()

    def abandon(self) -> None:
        """The client left (or the proxy reset the stream) before the answer ended."""
        if self.done:
            return
        self.done = True
        flow, ctx, attempt = self._flow, self._ctx, self._attempt
        if self._rw is not None:
            self._rw.absorb(self._rw.pending)
            flow.stream_done(ctx, attempt, self._rw.close(cancelled=True))
            return
        self._complete(ok=False, usage=None)
        flow.finish(ctx, status=499, usage=ctx.unanswered_usage(), records=flow.rejected_records(ctx, 499))

    def interrupt(self, ending: Ending) -> list[messages.ProcessingResponse]:
        """The stream's time is up (its deadline, or the picker is shutting down): end the answer now, charged
        the engine's work so far, as the gateway ends it."""
        if self.done:
            return []
        flow, ctx, attempt, rw = self._flow, self._ctx, self._attempt, self._rw
        if self.mode == "relay":
            assert rw is not None
            out = rw.fail(ending.kind, ending.message, ending.code)
            self.done = True
            rw.absorb(rw.take_pending())
            flow.stream_done(ctx, attempt, rw.close(cancelled=False))
            return messages.body_pieces(out, response=True)
        if rw is None:  # a plain or refused answer: the engine's usage is not known before its end
            return self._fail(ending.error())
        rw.absorb(rw.take_pending())
        usage = flow.charged(ctx, attempt, rw.close(cancelled=True))
        ctx.spent = (ctx.spent or Usage()) + usage
        self._complete(ok=False, usage=usage)
        return self._fail(ending.error(), completed=True)

    # ---- modes --------------------------------------------------------------------------------

    def _relay(self, chunk: bytes, *, end: bool) -> list[messages.ProcessingResponse]:
        rw = self._rw
        assert rw is not None
        out = rw.feed(chunk) if chunk else b""
        if not end:
            return messages.body_pieces(out, response=True, end=False) if out else []
        if not rw.ended:
            out += rw.fail("midstream", "the engine closed the stream before it finished", "upstream_error")
        self.done = True
        rw.absorb(rw.take_pending())  # a last event without its newline, or what followed an early end
        self._flow.stream_done(self._ctx, self._attempt, rw.close(cancelled=False))
        return messages.body_pieces(out, response=True)

    def _finish_buffered(self) -> list[messages.ProcessingResponse]:
        if self.mode == "refused":
            raw = b"".join(self._buf)
            self._ctx.spent = self._ctx.spent or Usage()  # the engine refused: no work done
            self._complete(ok=False, usage=None)
            self._flow.metrics.upstream_errors.labels(self._attempt.model, self._attempt.endpoint.id, "status").inc()
            return self._fail(from_engine(self._status, raw, endpoint=self._attempt.endpoint.id,
                                          retry_after=self._retry_after), completed=True)
        if self.mode == "assemble":
            return self._assembled()
        return self._plain()

    def _assembled(self) -> list[messages.ProcessingResponse]:
        rw, ctx, attempt = self._rw, self._ctx, self._attempt
        assert rw is not None
        out = rw.close(cancelled=False)
        usage = self._flow.charged(ctx, attempt, out)
        ctx.spent = (ctx.spent or Usage()) + usage
        ok = out.ok and out.assembled is not None
        self._complete(ok=ok, usage=usage)
        if not ok:
            self._flow.metrics.upstream_errors.labels(attempt.model, attempt.endpoint.id,
                                                      out.error_kind or "bad_response").inc()
            error = UpstreamBadResponseError("the engine broke off or sent an answer the gateway cannot assemble")
            return self._fail(error, completed=True)
        ep = attempt.endpoint
        obj = answer_of(out, usage, model=attempt.model if ep.model != attempt.model else ep.model)
        return self._answer(orjson.dumps(obj), usage, store=obj)

    def _plain(self) -> list[messages.ProcessingResponse]:
        ctx, attempt = self._ctx, self._attempt
        ep = attempt.endpoint
        raw = b"".join(self._buf)
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            obj = None
        if not isinstance(obj, dict) or not isinstance(obj.get("choices"), list):
            self._flow.metrics.upstream_errors.labels(attempt.model, ep.id, "bad_response").inc()
            self._complete(ok=False, usage=None)
            error = UpstreamBadResponseError("the engine returned a response that is not an OpenAI completion")
            return self._fail(error, completed=True)
        usage = parse_usage(obj.get("usage"))
        if usage is None:
            self._flow.metrics.upstream_errors.labels(attempt.model, ep.id, "bad_usage").inc()
            usage = fallback_usage(prompt_estimate=ctx.prompt_estimate, output_chunks=0)
        usage = capped(usage, ctx.completion_cap)  # an engine that ignored max_tokens: not charged beyond it
        ctx.spent = (ctx.spent or Usage()) + usage
        self._complete(ok=True, usage=usage)
        if ep.model != attempt.model:
            obj["model"] = attempt.model
            raw = orjson.dumps(obj)
        return self._answer(raw, usage, store=obj)

    # ---- endings ------------------------------------------------------------------------------

    def _complete(self, *, ok: bool, usage: Usage | None) -> None:
        """Once per engine call (an unreached endpoint's call is over at the response headers)."""
        if self._completed:
            return
        self._completed = True
        self._flow.stages.scheduler.on_complete(self._attempt.routing, self._attempt.endpoint, ok=ok, usage=usage)

    def _answer(self, body: bytes, usage: Usage, *, store: dict[str, object]) -> list[messages.ProcessingResponse]:
        """A complete non-streaming answer: headers and body together, the request finished as the gateway does."""
        flow, ctx, attempt = self._flow, self._ctx, self._attempt
        self.done = True
        record = flow.record(ctx, model=attempt.model, tier=attempt.tier, endpoint=attempt.endpoint.id, usage=usage,
                             status=200)
        keep = store if ctx.lookup is not None and ctx.lookup.status == CacheStatus.MISS else None
        flow.finish(ctx, status=200, usage=usage, records=[record], store=keep)
        headers = {**flow.headers(ctx, attempt), **self._extra, "content-type": "application/json",
                   "content-length": str(len(body))}
        return [messages.response_headers(set_headers=headers), *messages.body_pieces(body, response=True)]

    def _replaced(self, exc: FleetGateError) -> list[messages.ProcessingResponse]:
        """The gateway's error answer in place of the proxy's, as a mutation of the response it is passing."""
        self.done = True
        answer = self._flow.error(self._ctx, exc)
        headers = {**answer.headers, "content-type": answer.media_type, "content-length": str(len(answer.body))}
        return [messages.response_headers(set_headers=headers), *messages.body_pieces(answer.body, response=True)]

    def _fail(self, exc: FleetGateError, *, completed: bool = False) -> list[messages.ProcessingResponse]:
        """The gateway's error answer in place of the engine's (the engine call is over)."""
        if not completed:
            self._complete(ok=False, usage=None)
        self.done = True
        answer = self._flow.error(self._ctx, exc)
        return [messages.immediate(answer.status, {**answer.headers, **self._extra}, answer.body,
                                   media_type=answer.media_type)]
