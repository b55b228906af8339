"""The streamed body mutations the Endpoint Picker sends back: what the proxy requires of each piece.

Envoy in FULL_DUPLEX_STREAMED mode accepts a body answer only as a `streamed_response` (a plain body mutation is
a protocol error that fails the request), injects each piece's bytes and ends the stream at the piece that says
`end_of_stream`. These check the pieces field by field on the parsed wire bytes, as the proxy reads them.
"""

from __future__ import annotations

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from fleetgate.gateway.epp.messages import BODY_PIECE, body_pieces


def on_the_wire(out: list[pb.ProcessingResponse], *, response: bool) -> list[tuple[bytes, bool]]:
    """(bytes, end_of_stream) of each piece as the proxy parses it; fails unless each is a streamed_response of
    the right direction."""
    pieces = []
    for resp in out:
        parsed = pb.ProcessingResponse.FromString(resp.SerializeToString())
        assert parsed.WhichOneof("response") == ("response_body" if response else "request_body")
        mutation = (parsed.response_body if response else parsed.request_body).response.body_mutation
        assert mutation.WhichOneof("mutation") == "streamed_response"
        pieces.append((mutation.streamed_response.body, mutation.streamed_response.end_of_stream))
    return pieces


@pytest.mark.parametrize("response", [True, False])
@pytest.mark.parametrize("end", [True, False])
def test_an_empty_body_is_still_one_streamed_piece(response: bool, end: bool) -> None:
    # an empty, not-final piece sets no field: it must still be present as a streamed_response, or the proxy
    # would read a plain (invalid) body mutation
    assert on_the_wire(body_pieces(b"", response=response, end=end), response=response) == [(b"", end)]


@pytest.mark.parametrize("size", [1, BODY_PIECE - 1, BODY_PIECE, BODY_PIECE + 1, 2 * BODY_PIECE, 2 * BODY_PIECE + 7])
@pytest.mark.parametrize("end", [True, False])
def test_a_body_goes_back_in_order_in_bounded_pieces_the_last_one_ending_it(size: int, end: bool) -> None:
    body = bytes(i % 251 for i in range(size))
    pieces = on_the_wire(body_pieces(body, response=True, end=end), response=True)
    assert b"".join(p for p, _ in pieces) == body
    assert all(0 < len(p) <= BODY_PIECE for p, _ in pieces)
    assert len(pieces) == -(-size // BODY_PIECE)
    assert [e for _, e in pieces] == [False] * (len(pieces) - 1) + [end]
