"""The live monitor's rounds, asked of the records service by each replica's reaper.

The judging itself is the records service's (services/records/monitor.py: which runs are due,
the claim that makes each check happen once across replicas, the pause and the alert); here a
replica asks for a round — in the background, so a slow judge never holds up the reaper's other
work, and at most one round at a time per replica — and counts the alerts its round raised in
``rsigym_monitor_alerts_total{category}`` (each alert is raised by exactly one replica).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from gateway.context import Gateway
from gateway.proxy import operator_call
from kit.errors import GymError
from kit.ids import new_id

log = logging.getLogger("rsigym.gateway")

PATH = "/v1/operator/monitor"


async def monitor_round(gw: Gateway) -> dict[str, Any]:
    """One round now: ``{"enabled", "checked": [...], "alerts": [...]}`` (the records service's answer)."""
    if not gw.config.monitor.enabled or "records" not in gw.links:
        return {"enabled": False, "checked": [], "alerts": []}
    upstream = await operator_call(gw, "records", "POST", PATH, new_id("req"))
    if upstream.status_code != 200:
        raise RuntimeError(f"records answered {upstream.status_code}: {upstream.text[:300]}")
    result: dict[str, Any] = json.loads(upstream.content)
    for alert in result.get("alerts") or []:
        gw.metrics.monitor_alerts.labels(str(alert.get("category"))).inc()
    if result.get("alerts"):
        log.warning("live monitor: %d alert(s); paused runs %s", len(result["alerts"]),
                    sorted({a["run_id"] for a in result["alerts"] if a.get("paused")}))
    return result


class MonitorLoop:
    """The reaper's hand on the monitor: :meth:`kick` starts a round unless one is still running."""

    def __init__(self, gw: Gateway):
        self.gw = gw
        self.task: asyncio.Task[None] | None = None

    def kick(self) -> None:
        if self.gw.config.monitor.enabled and (self.task is None or self.task.done()):
            self.task = asyncio.create_task(self._round())

    async def _round(self) -> None:
        try:
            await monitor_round(self.gw)
        except (GymError, RuntimeError, ValueError) as err:
            log.warning("live monitor: a round was skipped: %s", getattr(err, "message", None) or err)

    async def stop(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
            try:
                await self.task
            except asyncio.CancelledError:
                pass
