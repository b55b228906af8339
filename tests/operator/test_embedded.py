"""The operator embedded in a test (fleetgate.operator.embedded): it stops at once, leaves the caller's tasks
alone, and a crash is an error, not a silently cancelled task.

Before it, the operator ran in the test's event loop, where Kopf waits its fixed 5 s for every task created
after its start (the test's teardown awaiting it, the API server's connections) and then cancels them: each
kmock operator test spent 5 s idle in teardown, and the "operator crashed" check never saw a crash."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import kopf
import pytest

from fleetgate.operator.embedded import (
    QUEUE_EXIT_S,
    SLOW_STOP_S,
    EmbeddedOperator,
    OperatorError,
    running_operator,
)

from .conftest import Cluster, operator_registry, wait_for
from .test_operator_kmock import SMALL, _cr

pytestmark = [pytest.mark.kube, pytest.mark.timeout(60)]

async def test_stop_is_prompt_and_leaves_the_callers_tasks_alone(cluster: Cluster) -> None:
    registry = operator_registry(cluster)
    embedded = EmbeddedOperator(registry=registry, clusterwide=True, standalone=True, memo=kopf.Memo())
    embedded.start()
    bystander: asyncio.Task[None] | None = None
    try:
        await embedded.wait_ready(within=20)
        bystander = asyncio.create_task(asyncio.sleep(3600))  # a task of the caller's, born after the start
        created = time.monotonic()
        await cluster.create(_cr("qwen", SMALL))  # the test client's connection stays open past the stop
        await wait_for(lambda: "qwen" in cluster.objects("deployments"), what="a reconcile")
        reconcile_s = time.monotonic() - created  # this machine's pace now: from a create to its first child
        assert not embedded.done()
    finally:
        t0 = time.monotonic()
        await embedded.stop(within=15)
        stopped_in = time.monotonic() - t0
    assert embedded.done()
    # The stop cuts the reconcile in flight short (QUEUE_EXIT_S), then closes the clients: a fraction of a second
    # and a few round trips, which take about what reaching the first child took. The stall this guards against
    # is Kopf's fixed 5 s grace for tasks it takes for its own: over the bound while a reconcile's first child
    # comes within 1.9 s.
    bound = QUEUE_EXIT_S + 1.0 + 2 * reconcile_s
    assert stopped_in < bound, (f"the operator took {stopped_in:.1f} s to stop (bound {bound:.1f} s); its tasks "
                                f"after {SLOW_STOP_S} s: {embedded.lingering}")
    assert bystander is not None and not bystander.done(), "the operator cancelled a task of the caller's"
    bystander.cancel()
    # The API server in this loop still answers the test's client after the operator is gone.
    await cluster.patch_spec("qwen", {"replicas": 2})


async def test_a_crash_at_start_up_is_an_error_not_a_cancelled_task(cluster: Cluster) -> None:
    """(About 5 s: on a crash Kopf leaves its own stop-flag waiter running and waits its fixed grace for it.)"""
    registry = operator_registry(cluster)

    @kopf.on.startup(registry=registry)
    async def _refuse(**_: Any) -> None:
        raise kopf.PermanentError("start-up refused (test)")

    with pytest.raises(OperatorError) as caught:
        async with running_operator(registry=registry, clusterwide=True, standalone=True, ready_within=20):
            raise AssertionError("the operator became ready although a start-up handler refused")
    assert "crashed" in str(caught.value)
    outcomes = getattr(caught.value.__cause__, "outcomes", {})  # Kopf's ActivityError, which it does not export
    assert [str(o.exception) for o in outcomes.values() if o.exception is not None] == ["start-up refused (test)"]


def test_the_flags_are_its_own() -> None:
    with pytest.raises(TypeError, match="stop_flag"):
        EmbeddedOperator(stop_flag=asyncio.Event())
