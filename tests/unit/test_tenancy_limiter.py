"""The limiter on both backends (memory, and real Redis running the Lua scripts): windows, refunds on
settle, Retry-After, messages that name the limit, fail-open/closed on a store outage."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from decimal import Decimal

import pytest

from fleetgate.core.errors import RateLimitError, UpstreamUnavailableError
from fleetgate.core.kvstore import MemoryKVStore, StoreUnavailableError
from fleetgate.core.types import Usage
from fleetgate.gateway.stages import Tenant
from fleetgate.gateway.tenancy.config import TenancyConfig
from fleetgate.gateway.tenancy.limiter import CounterBackend, TenancyLimiter
from fleetgate.gateway.tenancy.limiter_circuit import Move, StoreCircuit
from fleetgate.gateway.tenancy.limiter_memory import MemoryCounters
from fleetgate.gateway.tenancy.limiter_redis import RedisCounters
from fleetgate.gateway.tenancy.limiter_windows import Check
from fleetgate.gateway.tenancy.meter import TokenMeter
from fleetgate.gateway.tenancy.pricing import PriceBook, cost_micros
from fleetgate.gateway.tenancy.redis_client import redis_client

T0 = 1_800_000_000.0 - (1_800_000_000.0 % 86400) + 3600  # 01:00:00 UTC on some day, minute-aligned
ACME = Tenant(id="acme")


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture(params=["memory", "redis"])
async def counters(request: pytest.FixtureRequest) -> AsyncIterator[CounterBackend]:
    if request.param == "memory":
        yield MemoryCounters()
        return
    url = request.getfixturevalue("redis_url")
    client = redis_client(url)
    yield RedisCounters(client, url=url)
    await client.aclose()


def make(counters: CounterBackend, clock: Clock, *, sliding: bool = True, **tenant: object) -> TenancyLimiter:
    config = TenancyConfig.model_validate({
        "tenants": [{"id": "acme", **tenant}],
        "prices": {"m": {"input_usd_per_1m": "10", "output_usd_per_1m": "30"}},
        "sliding_minute_windows": sliding,
    })
    prices = PriceBook(config, meter=TokenMeter(MemoryKVStore()))
    return TenancyLimiter(config, counters=counters, prices=prices, clock=clock)


async def test_rpm_refuses_the_request_over_the_limit_with_retry_after(counters: CounterBackend) -> None:
    clock = Clock(T0 + 15)
    lim = make(counters, clock, rpm=3, sliding=False)
    for _ in range(3):
        await lim.reserve(ACME, "m", prompt_tokens=1, max_tokens=1)
    with pytest.raises(RateLimitError) as err:
        await lim.reserve(ACME, "m", prompt_tokens=1, max_tokens=1)
    assert err.value.status == 429 and "rpm=3" in err.value.message and "requests-per-minute" in err.value.message
    assert err.value.headers["Retry-After"] == "45"  # fixed window: until the minute ends
    clock.t = T0 + 60
    await lim.reserve(ACME, "m", prompt_tokens=1, max_tokens=1)  # a new minute


async def test_sliding_minute_counts_the_previous_minute_by_its_remaining_weight(counters: CounterBackend) -> None:
    clock = Clock(T0 + 50)
    lim = make(counters, clock, rpm=4)
    for _ in range(4):
        await lim.reserve(ACME, "m", prompt_tokens=1, max_tokens=1)
    clock.t = T0 + 60 + 30  # halfway into the next minute: load = 0 + 4 * 0.5 = 2
    await lim.reserve(ACME, "m", prompt_tokens=1, max_tokens=1)
    await lim.reserve(ACME, "m", prompt_tokens=1, max_tokens=1)  # 2 + 1 + 1 = 4 <= 4
    with pytest.raises(RateLimitError) as err:
        await lim.reserve(ACME, "m", prompt_tokens=1, max_tokens=1)
    # cur=2, prev=4: needs prev weight <= (4 - 2 - 1) / 4 = 0.25, i.e. 45 s into the minute: 15 s from now.
    assert err.value.retry_after_s == pytest.approx(15.0)
    assert err.value.headers["Retry-After"] == "15"


async def test_tpm_reserves_prompt_plus_max_tokens_and_settle_refunds(counters: CounterBackend) -> None:
    clock = Clock(T0)
    lim = make(counters, clock, tpm=1000)
    first = await lim.reserve(ACME, "m", prompt_tokens=100, max_tokens=500)
    assert first.estimated_tokens == 600
    with pytest.raises(RateLimitError) as err:
        await lim.reserve(ACME, "m", prompt_tokens=100, max_tokens=400)  # 600 + 500 > 1000
    assert "tpm=1000" in err.value.message and "600" in err.value.message
    await lim.settle(first, Usage(prompt_tokens=100, completion_tokens=50))  # 150 real tokens
    second = await lim.reserve(ACME, "m", prompt_tokens=100, max_tokens=400)  # 150 + 500 <= 1000
    await lim.settle(second, Usage(prompt_tokens=100, completion_tokens=400))
    assert (await lim.status("acme"))["tpm"]["used"] == 650


async def test_request_without_max_tokens_reserves_the_configured_default(counters: CounterBackend) -> None:
    lim = make(counters, Clock(T0), tpm=5000)
    r = await lim.reserve(ACME, "m", prompt_tokens=10, max_tokens=None)
    assert r.estimated_tokens == 10 + 1024
    nothing = await lim.reserve(ACME, "m", prompt_tokens=10, max_tokens=0)  # a route that generates nothing
    assert nothing.estimated_tokens == 10


async def test_daily_budget_reserves_dollars_and_retry_after_is_midnight(counters: CounterBackend) -> None:
    clock = Clock(T0)  # 01:00 UTC
    # $10/1M in, $30/1M out: 1000 in + 1000 out = 10_000 + 30_000 micro-dollars = $0.04 estimated.
    lim = make(counters, clock, daily_budget_usd=Decimal("0.10"))
    held = [await lim.reserve(ACME, "m", prompt_tokens=1000, max_tokens=1000) for _ in range(2)]
    assert held[0].estimated_micros == 40_000
    with pytest.raises(RateLimitError) as err:
        await lim.reserve(ACME, "m", prompt_tokens=1000, max_tokens=1000)  # 0.08 + 0.04 > 0.10
    assert err.value.code == "insufficient_quota" and "daily budget" in err.value.message
    assert err.value.headers["Retry-After"] == str(23 * 3600)
    for r in held:  # each used only 1000 prompt + 100 completion tokens = 13_000 µ$
        await lim.settle(r, Usage(prompt_tokens=1000, completion_tokens=100))
    assert (await lim.status("acme"))["daily_budget"]["used"] == 26_000
    await lim.reserve(ACME, "m", prompt_tokens=1000, max_tokens=1000)  # fits again after refunds


async def test_monthly_budget_is_checked_with_the_others(counters: CounterBackend) -> None:
    lim = make(counters, Clock(T0), rpm=100, daily_budget_usd=Decimal("1"), monthly_budget_usd=Decimal("0.05"))
    await lim.reserve(ACME, "m", prompt_tokens=1000, max_tokens=1000)
    with pytest.raises(RateLimitError) as err:
        await lim.reserve(ACME, "m", prompt_tokens=1000, max_tokens=1000)
    assert "monthly budget" in err.value.message
    status = await lim.status("acme")
    assert status["rpm"]["used"] == 1  # the refused request reserved nothing anywhere
    assert status["daily_budget"]["used"] == 40_000 and status["monthly_budget"]["used"] == 40_000


async def test_a_request_larger_than_the_limit_says_so(counters: CounterBackend) -> None:
    lim = make(counters, Clock(T0), tpm=100)
    with pytest.raises(RateLimitError, match="alone exceeds"):
        await lim.reserve(ACME, "m", prompt_tokens=50, max_tokens=100)


async def test_settle_is_idempotent_and_tenants_without_limits_pass(counters: CounterBackend) -> None:
    lim = make(counters, Clock(T0), tpm=1000)
    r = await lim.reserve(ACME, "m", prompt_tokens=100, max_tokens=100)
    await lim.settle(r, Usage(prompt_tokens=100, completion_tokens=10))
    await lim.settle(r, Usage(prompt_tokens=100, completion_tokens=10))
    assert (await lim.status("acme"))["tpm"]["used"] == 110
    other = await lim.reserve(Tenant(id="unlisted"), "m", prompt_tokens=10**9, max_tokens=10**9)
    assert other.token == ""


async def test_settle_never_resurrects_an_expired_window(counters: CounterBackend) -> None:
    await counters.adjust([Move("fg:tenancy:lim:{acme}:tpm:1", -500, 60_000)])
    assert await counters.read(["fg:tenancy:lim:{acme}:tpm:1"]) == [0]


class DownCounters:
    def __init__(self) -> None:
        self.calls = 0

    async def reserve(self, checks: Sequence[Check], *, now_ms: int, epoch_key: str,
                      nonce: str) -> tuple[int, int, int, str]:
        self.calls += 1
        raise StoreUnavailableError("down")

    async def adjust(self, moves: Sequence[Move]) -> None:
        raise StoreUnavailableError("down")

    async def read(self, keys: Sequence[str]) -> list[int]:
        raise StoreUnavailableError("down")


async def test_store_outage_fails_open_by_default_and_closed_when_configured() -> None:
    config = TenancyConfig.model_validate({"tenants": [{"id": "acme", "rpm": 1}]})
    prices = PriceBook(config, meter=TokenMeter(MemoryKVStore()))
    down = DownCounters()
    open_lim = TenancyLimiter(config, counters=down, prices=prices)
    for _ in range(3):  # over rpm=1, but the store is down: let through
        r = await open_lim.reserve(ACME, "m", prompt_tokens=1, max_tokens=1)
        await open_lim.settle(r, Usage(prompt_tokens=1))
    assert down.calls == 1  # after the first failure the store is left alone for store_retry_s
    retrying = DownCounters()
    eager = TenancyLimiter(config.model_copy(update={"store_retry_s": 0.0}), counters=retrying, prices=prices)
    for _ in range(3):
        await eager.reserve(ACME, "m", prompt_tokens=1, max_tokens=1)
    assert retrying.calls == 3
    closed = TenancyLimiter(config.model_copy(update={"on_store_error": "closed"}), counters=DownCounters(),
                            prices=prices)
    with pytest.raises(UpstreamUnavailableError):
        await closed.reserve(ACME, "m", prompt_tokens=1, max_tokens=1)


async def test_redis_counters_report_an_unreachable_server_as_unavailable() -> None:
    client = redis_client("redis://127.0.0.1:1/0", timeout_s=0.2)
    with pytest.raises(StoreUnavailableError):
        await RedisCounters(client, url="redis://127.0.0.1:1/0").read(["k"])
    await client.aclose()


class FlakyCounters(MemoryCounters):
    """Memory counters behind a switch: while `down`, every call fails as an unreachable store would."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.calls = 0

    def _gate(self) -> None:
        self.calls += 1
        if self.down:
            raise StoreUnavailableError("down")

    async def reserve(self, checks: Sequence[Check], *, now_ms: int, epoch_key: str,
                      nonce: str) -> tuple[int, int, int, str]:
        self._gate()
        return await super().reserve(checks, now_ms=now_ms, epoch_key=epoch_key, nonce=nonce)

    async def adjust(self, moves: Sequence[Move]) -> None:
        self._gate()
        await super().adjust(moves)


def flaky_limiter(store: FlakyCounters, *, policy: str, **tenant: object) -> TenancyLimiter:
    config = TenancyConfig.model_validate({
        "tenants": [{"id": "acme", **tenant}], "on_store_error": policy, "store_retry_s": 0.05,
        "prices": {"m": {"input_usd_per_1m": "10", "output_usd_per_1m": "30"}},
    })
    return TenancyLimiter(config, counters=store, prices=PriceBook(config, meter=TokenMeter(MemoryKVStore())))


@pytest.mark.parametrize("policy", ["open", "closed"])
async def test_limits_come_back_while_traffic_flows(policy: str) -> None:
    """Steady traffic during and after an outage: the store is probed every store_retry_s (not pushed away by
    every short-circuited request) and the limits apply again within that time of the store's return."""
    store = FlakyCounters()
    lim = flaky_limiter(store, policy=policy, rpm=1000)
    store.down = True
    outcomes: list[str] = []
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:  # 200 requests/s for 0.5 s, far more than one per store_retry_s
        try:
            await lim.reserve(ACME, "m", prompt_tokens=1, max_tokens=1)
            outcomes.append("served")
        except UpstreamUnavailableError:
            outcomes.append("503")
        await asyncio.sleep(0.005)
    assert set(outcomes) == ({"served"} if policy == "open" else {"503"})
    assert 5 <= store.calls <= 12  # one probe per 0.05 s, not one call per request nor none at all
    store.down = False
    back = time.monotonic()
    while lim.circuit.down:
        with contextlib.suppress(UpstreamUnavailableError):
            await lim.reserve(ACME, "m", prompt_tokens=1, max_tokens=1)
        await asyncio.sleep(0.005)
    assert time.monotonic() - back < 0.1
    r = await lim.reserve(ACME, "m", prompt_tokens=1, max_tokens=1)
    assert r.token  # reserved in the store again


async def test_spend_let_through_during_an_outage_reaches_the_budget_counters() -> None:
    store = FlakyCounters()
    lim = flaky_limiter(store, policy="open", tpm=10**6, daily_budget_usd="1")
    first = await lim.reserve(ACME, "m", prompt_tokens=10, max_tokens=100)  # before: reserved normally
    store.down = True
    usages = [Usage(prompt_tokens=10 + i, completion_tokens=20 * i) for i in range(5)]
    for u in usages:  # through the outage: unmetered, settled into the queue
        r = await lim.reserve(ACME, "m", prompt_tokens=10, max_tokens=100)
        await lim.settle(r, u)
    await lim.settle(first, Usage(prompt_tokens=10, completion_tokens=7))  # a settle that fails, queued
    assert lim.circuit.pending > 0
    await asyncio.sleep(0.06)
    store.down = False
    probe = await lim.reserve(ACME, "m", prompt_tokens=0, max_tokens=1)  # reaches the store, replays
    await lim.settle(probe, Usage())
    assert lim.circuit.pending == 0
    status = await lim.status("acme")
    everything = [*usages, Usage(prompt_tokens=10, completion_tokens=7)]
    assert status["tpm"]["used"] == sum(u.total_tokens for u in everything)
    rates = lim._prices.rates("m")
    assert status["daily_budget"]["used"] == sum(cost_micros(u, rates) for u in everything)


async def test_sequences_multiply_the_completion_and_fit_lowers_max_tokens(counters: CounterBackend) -> None:
    lim = make(counters, Clock(T0), tpm=1000)
    r = await lim.reserve(ACME, "m", prompt_tokens=10, max_tokens=50, sequences=6)
    assert r.estimated_tokens == 10 + 300 and r.max_tokens is None
    with pytest.raises(RateLimitError):  # 690 left, 10 x 100 does not fit and the client chose max_tokens
        await lim.reserve(ACME, "m", prompt_tokens=10, max_tokens=100, sequences=10)
    fitted = await lim.reserve(ACME, "m", prompt_tokens=10, max_tokens=100, sequences=10, fit_max_tokens=True)
    assert fitted.max_tokens == 68 and fitted.estimated_tokens == 10 + 680  # (690 - 10) // 10
    assert (await lim.status("acme"))["tpm"]["used"] == 1000


def test_circuit_admits_one_probe_and_a_cancelled_probe_does_not_wedge_it() -> None:
    now = [100.0]
    circuit = StoreCircuit(retry_s=1.0, clock=lambda: now[0])
    first = circuit.admit()
    assert first is not None
    circuit.failed(first)
    assert circuit.down and circuit.admit() is None  # open: short-circuit, and the window does not move
    now[0] = 100.9
    assert circuit.admit() is None
    now[0] = 101.0
    probe = circuit.admit()
    assert probe is not None and circuit.admit() is None  # half-open: one probe at a time
    circuit.abandoned()  # the probing request was cancelled before Redis answered
    again = circuit.admit()
    assert again is not None
    circuit.succeeded(again)
    assert not circuit.down
    circuit.failed(first)  # a failure of a call sent before the store came back is stale
    assert not circuit.down


def test_circuit_queue_is_bounded_counted_and_merged_per_key() -> None:
    circuit = StoreCircuit(retry_s=1.0, max_pending=3)
    circuit.queue([Move("a", 5, 10, 5), Move("b", -2, 10, 1), Move("a", 1, 10, 1), Move("c", 7, 10, 7)])
    assert circuit.pending == 3 and circuit.dropped == 1  # the oldest move went, and was counted
    assert sorted(circuit.take(), key=lambda m: m.key) == [Move("a", 1, 10, 1), Move("b", -2, 10, 1),
                                                           Move("c", 7, 10, 7)]
    circuit.queue([Move("a", 5, 10, 5), Move("a", -3, 20, 2)])
    assert circuit.take() == [Move("a", 2, 20, 7)]


def make_with_adapter(counters: CounterBackend, clock: Clock, **tenant: object) -> TenancyLimiter:
    price = {"input_usd_per_1m": "10", "output_usd_per_1m": "30"}
    config = TenancyConfig.model_validate({
        "tenants": [{"id": "acme", **tenant}], "prices": {"m": price, "pirate": price},
    })
    return TenancyLimiter(config, counters=counters, prices=PriceBook(config, meter=TokenMeter(MemoryKVStore())),
                          clock=clock)


async def test_a_model_budget_caps_that_model_only_and_settles_like_the_tenant_budget(
    counters: CounterBackend,
) -> None:
    """A per-model (per-adapter) cap: `pirate` stops at $0.10 a day while the base model `m` and the tenant's own
    budget go on; the cap's window settles to real usage like the tenant's windows do."""
    lim = make_with_adapter(counters, Clock(T0), daily_budget_usd=Decimal("1"),
                            model_budgets={"pirate": {"daily_budget_usd": "0.10"}})
    held = [await lim.reserve(ACME, "pirate", prompt_tokens=1000, max_tokens=1000) for _ in range(2)]  # 2 x $0.04
    with pytest.raises(RateLimitError) as err:
        await lim.reserve(ACME, "pirate", prompt_tokens=1000, max_tokens=1000)
    assert err.value.code == "insufficient_quota"
    assert "daily budget for model 'pirate'" in err.value.message
    assert err.value.headers["Retry-After"] == str(23 * 3600)
    for _ in range(3):  # the base model is not capped by the adapter's budget
        await lim.reserve(ACME, "m", prompt_tokens=1000, max_tokens=1000)
    for r in held:
        await lim.settle(r, Usage(prompt_tokens=1000, completion_tokens=100))  # 13_000 µ$ each
    status = await lim.status("acme")
    assert status["model_daily_budget:pirate"]["used"] == 26_000
    assert status["daily_budget"]["used"] == 26_000 + 3 * 40_000  # the tenant's budget counts every model
    await lim.reserve(ACME, "pirate", prompt_tokens=1000, max_tokens=1000)  # fits again after the refunds


async def test_a_model_budget_alone_leaves_other_models_unmetered(counters: CounterBackend) -> None:
    lim = make_with_adapter(counters, Clock(T0), model_budgets={"pirate": {"monthly_budget_usd": "0.05"}})
    for _ in range(5):  # no tenant-wide limit: `m` reserves nothing anywhere
        r = await lim.reserve(ACME, "m", prompt_tokens=1000, max_tokens=1000)
        assert r.token == ""
    await lim.reserve(ACME, "pirate", prompt_tokens=1000, max_tokens=1000)
    with pytest.raises(RateLimitError) as err:
        await lim.reserve(ACME, "pirate", prompt_tokens=1000, max_tokens=1000)
    assert "monthly budget for model 'pirate'" in err.value.message


async def test_another_models_cap_does_not_set_max_tokens_on_an_uncapped_model(counters: CounterBackend) -> None:
    """Only this request's token or dollar windows bound its spend: a tenant with an rpm limit and a cap on
    `pirate` gets no `max_tokens` forced onto its `m` requests (it once got the default, as if `m` were capped)."""
    lim = make_with_adapter(counters, Clock(T0), rpm=100, model_budgets={"pirate": {"daily_budget_usd": "1"}})
    free = await lim.reserve(ACME, "m", prompt_tokens=10, max_tokens=None, fit_max_tokens=True)
    assert free.max_tokens is None
    capped = await lim.reserve(ACME, "pirate", prompt_tokens=10, max_tokens=None, fit_max_tokens=True)
    assert capped.max_tokens is not None


@pytest.mark.parametrize("policy", ["open", "closed"])
async def test_a_model_budget_while_the_store_is_down(policy: str) -> None:
    """Redis down: a capped model follows `on_store_error` like the tenant's windows (served, or 503), an
    uncapped model of the same tenant never needs the store; spend let through reaches the model's window
    once the store is back."""
    store = FlakyCounters()
    config = TenancyConfig.model_validate({
        "tenants": [{"id": "acme", "model_budgets": {"pirate": {"daily_budget_usd": "1"}}}],
        "on_store_error": policy, "store_retry_s": 0.0,
        "prices": {n: {"input_usd_per_1m": "10", "output_usd_per_1m": "30"} for n in ("m", "pirate")},
    })
    lim = TenancyLimiter(config, counters=store, prices=PriceBook(config, meter=TokenMeter(MemoryKVStore())))
    store.down = True
    assert (await lim.reserve(ACME, "m", prompt_tokens=1000, max_tokens=100)).token == ""
    if policy == "closed":
        with pytest.raises(UpstreamUnavailableError):
            await lim.reserve(ACME, "pirate", prompt_tokens=1000, max_tokens=100)
        return
    r = await lim.reserve(ACME, "pirate", prompt_tokens=1000, max_tokens=100)
    await lim.settle(r, Usage(prompt_tokens=1000, completion_tokens=100))  # 13_000 µ$, queued
    store.down = False
    await lim.reserve(ACME, "pirate", prompt_tokens=1, max_tokens=1)  # writes the queued spend first
    assert (await lim.status("acme"))["model_daily_budget:pirate"]["used"] >= 13_000


async def _lose_everything(counters: CounterBackend) -> None:
    """What a Redis restart without persistence does to the counters (and the epoch keys)."""
    if isinstance(counters, MemoryCounters):
        counters.forget()
    else:
        assert isinstance(counters, RedisCounters)
        await counters._client.flushall()


@pytest.mark.parametrize("recreated_first", [True, False])
async def test_after_a_store_loss_the_counters_hold_the_real_cost_of_everything_settled_since(
    counters: CounterBackend, recreated_first: bool
) -> None:
    """Issue 26, defect 3: requests reserved before Redis lost its data and settled after it. The old rule
    (add `real - estimate` to any counter that exists) subtracted their estimates from a counter another
    request had recreated meanwhile: 83% under the ledger. The counter must equal the real cost of every
    request settled after the loss (what the ledger rows written after it hold), whatever was in flight,
    whichever request recreates the counter first."""
    lim = make(counters, Clock(T0), tpm=10**7, daily_budget_usd="100")
    rates = lim._prices.rates("m")
    before = await lim.reserve(ACME, "m", prompt_tokens=100, max_tokens=400)
    in_flight = [await lim.reserve(ACME, "m", prompt_tokens=100 + i, max_tokens=400) for i in range(5)]
    await lim.settle(before, Usage(prompt_tokens=100, completion_tokens=50))  # lost with the store
    await _lose_everything(counters)
    settled_after: list[Usage] = []
    if recreated_first:  # a new request recreates the counters before the in-flight ones settle
        fresh = await lim.reserve(ACME, "m", prompt_tokens=10, max_tokens=400)
    for i, r in enumerate(in_flight):
        usage = Usage(prompt_tokens=100 + i, completion_tokens=30 * i)
        await lim.settle(r, usage)
        settled_after.append(usage)
    if not recreated_first:  # the in-flight ones settle into missing counters, then a new request comes
        fresh = await lim.reserve(ACME, "m", prompt_tokens=10, max_tokens=400)
    await lim.settle(fresh, Usage(prompt_tokens=10, completion_tokens=7))
    settled_after.append(Usage(prompt_tokens=10, completion_tokens=7))
    status = await lim.status("acme")
    assert status["daily_budget"]["used"] == sum(cost_micros(u, rates) for u in settled_after)
    assert status["tpm"]["used"] == sum(u.total_tokens for u in settled_after)
    # and the next generation settles by deltas again: a reservation held and released leaves nothing
    r = await lim.reserve(ACME, "m", prompt_tokens=10, max_tokens=400)
    await lim.settle(r, Usage())
    assert (await lim.status("acme"))["daily_budget"]["used"] == status["daily_budget"]["used"]


def test_queued_moves_of_different_generations_are_not_merged() -> None:
    circuit = StoreCircuit(retry_s=1.0)
    circuit.queue([Move("a", -5, 10, 5, "e", "g1"), Move("a", -3, 10, 2, "e", "g2"), Move("a", -1, 10, 1, "e", "g1")])
    assert sorted(circuit.take(), key=lambda m: m.epoch) == [Move("a", -6, 10, 6, "e", "g1"),
                                                             Move("a", -3, 10, 2, "e", "g2")]
