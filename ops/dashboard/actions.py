"""The operator's actions on a run from the browser: top up, pause, resume, stop, revoke.

Each is the admin API's own registry call (gateway/admin.py), so a change made here is announced
to every gateway replica exactly as one made through ``/admin/v1/keys`` is (the registry publishes
it on the store's key channel once committed, access/fanout.py): a run paused or revoked in the
browser is refused by every replica. Only a run key may be acted on (child keys, the operator
key and agent-model meters are 404 here), and only while the action applies to the run's state
(:func:`ops.dashboard.queries.actions_for`): an ended run takes none. The routes that call these
depend on the session's CSRF token (``CsrfChecked``, ops/dashboard/app.py).
"""

from __future__ import annotations

import math
from typing import Any

from access.keys import KeyRegistry
from billing.money import usd_to_nusd
from gateway.schemas import MAX_USD
from kit.errors import Conflict, Unprocessable
from ops.dashboard.queries import ACTIONS, actions_for, run_key
from storage.store import Store

ACCOUNTS = ("run", "agent")
"""What a top-up credits: the run's service budget, or its agent-model meter."""


def parse_amount(raw: str | None) -> float:
    """A top-up amount typed into the form: a finite number of USD, > 0 and at most MAX_USD."""
    text = (raw or "").strip().lstrip("$").strip()
    try:
        amount = float(text)
    except ValueError:
        raise Unprocessable("the top-up amount must be a number of USD, e.g. 5 or 2.50", param="amount_usd") from None
    if not math.isfinite(amount) or amount <= 0:
        raise Unprocessable("the top-up amount must be more than $0", param="amount_usd")
    if amount > MAX_USD:
        raise Unprocessable(f"the top-up amount may be at most ${MAX_USD:,.0f}", param="amount_usd")
    if usd_to_nusd(amount) <= 0:
        raise Unprocessable("the top-up amount is too small to credit", param="amount_usd")
    return amount


def perform(store: Store, registry: KeyRegistry, run_id: str, action: str, fields: dict[str, str]) -> dict[str, Any]:
    """Do ``action`` on run ``run_id`` (a blocking store call: routes run it through ``Store.call``);
    returns the changed key's view. The amount is checked before the run is looked at, so a bad
    form changes nothing whatever the run."""
    if action not in ACTIONS:
        raise Unprocessable(f"unknown action {action!r}; expected {', '.join(ACTIONS)}", param="action")
    amount = parse_amount(fields.get("amount_usd")) if action == "topup" else None
    with store.transaction() as s:
        key = run_key(s, run_id)
        allowed = actions_for(key)
        meter_id = key.agent_meter_id
    if action not in allowed:
        raise Conflict(f"this run cannot be {_DONE[action]} now: it is "
                       + ("ended" if not allowed else "already paused" if action == "pause" else "not paused"))
    if action == "topup":
        account = fields.get("account") or "run"
        if account not in ACCOUNTS or (account == "agent" and meter_id is None):
            raise Unprocessable("top up the run's budget (run) or its agent-model meter (agent)", param="account")
        return registry.topup(meter_id if account == "agent" and meter_id else run_id, usd_to_nusd(amount or 0))
    if action == "stop":
        return registry.end_run(run_id, "stopped", None)
    return registry.set_status(run_id, {"pause": "paused", "resume": "active", "revoke": "revoked"}[action])


_DONE = {"topup": "topped up", "pause": "paused", "resume": "resumed", "stop": "stopped", "revoke": "revoked"}
DONE_MESSAGES = {
    "topup": "Topped up.", "pause": "Paused: the run's keys are refused until it is resumed.",
    "resume": "Resumed: the run's keys work again.",
    "stop": "Stopped: the run has ended; its keys are refused and its jobs are being stopped.",
    "revoke": "Revoked: the run's keys are refused for good.",
}
"""The confirmation shown after an action (chosen by the action's name: never text from the request)."""
