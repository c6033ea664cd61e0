"""Ending runs at their deadline, whether or not a call arrives (the gateway's reaper calls
:func:`end_expired_runs` every round; safe on any number of replicas).

Each expired run is claimed once in the store (billing/deadlines.py). The run's jobs and
sandboxes are stopped by the services that own them, through their own cancel paths (operator
routes ``/operator/runs/{run}/end``), so every ledger hold is settled or released by the code
that opened it. A run whose end could not be carried out (a service unreachable) is given back
and retried next round; the ``run.ended`` event is written once the end went through.
"""

from __future__ import annotations

import json
import logging
from functools import partial
from typing import Any

from billing import deadlines, rate_limits
from gateway.context import Gateway
from gateway.proxy import operator_call
from kit.errors import GymError
from kit.ids import new_id

log = logging.getLogger("rsigym.gateway")

ENDING_SERVICES = {"training": "/v1/operator/runs/{run}/end", "evaluation": "/v1/operator/runs/{run}/end",
                   "sandbox": "/operator/runs/{run}/end"}
"""The services that hold a run's long-lived work, and the route that stops it."""


async def end_expired_runs(gw: Gateway) -> list[dict[str, Any]]:
    """End every run whose deadline has passed and that no replica has ended yet; returns the
    ``run.ended`` event data of each run ended now."""
    ended = []
    for run_id, ends_at in await gw.store.call(deadlines.claim_expired_runs, gw.store):
        counts = {"jobs_cancelled": 0, "sandboxes_killed": 0}
        try:
            for service, path in ENDING_SERVICES.items():
                if service not in gw.links:
                    continue
                upstream = await operator_call(gw, service, "POST", path.format(run=run_id), new_id("req"))
                if upstream.status_code != 200:
                    raise RuntimeError(f"{service} answered {upstream.status_code}")
                for name, n in json.loads(upstream.content).items():
                    counts[name] = counts.get(name, 0) + int(n)
        except (GymError, RuntimeError, ValueError) as err:
            log.warning("run %s passed its deadline but could not be ended yet: %s", run_id, err)
            await gw.store.call(deadlines.unclaim, gw.store, run_id)
            continue
        data = {"ends_at": ends_at.isoformat(), **counts}
        await gw.store.call(partial(gw.records.run_ended, run_id=run_id, data=data))
        log.info("run %s ended at its deadline: %s", run_id, data)
        ended.append({"run_id": run_id, **data})
    return ended


async def reap_run_limits(gw: Gateway) -> int:
    """The reaper's run-limit round: end expired runs, drop past token counters."""
    ended = await end_expired_runs(gw)
    await gw.store.call(partial(rate_limits.prune, gw.store))
    return len(ended)
