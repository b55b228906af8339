"""Helpers for tests against kmock (an in-process Kubernetes API mock): a lightkube client, and polling."""

from __future__ import annotations

import asyncio
import time
from typing import Any


def client(url: str) -> Any:
    from lightkube import AsyncClient, KubeConfig
    from lightkube.config.models import Cluster, User

    return AsyncClient(config=KubeConfig.from_one(cluster=Cluster(server=url), user=User()))


async def eventually(check: Any, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)
