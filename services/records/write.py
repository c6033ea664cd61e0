"""What the gateway writes to the records: the events it appends to a run's chain
(services/records/events.py) — a call it refused, a run it ended — each in a transaction of its
own, sealed with the gym's internal secret like every other append."""

from __future__ import annotations

from typing import Any

from services.records.events import CALL_REFUSED, RUN_ENDED, EventLog
from storage.store import Store


class RunRecords:
    """The gateway's appends to the runs' event chains. Blocking (a store transaction): call off
    the event loop (``Store.call``)."""

    def __init__(self, store: Store, secret: str):
        self._log = EventLog(store, secret)

    def call_refused(self, *, run_id: str, key_id: str, data: dict[str, Any]) -> None:
        """A ``call.refused`` event: a known principal's call refused at the door or by a service."""
        self._log.record(run_id=run_id, kind=CALL_REFUSED, data=data, key_id=key_id)

    def run_ended(self, *, run_id: str, data: dict[str, Any]) -> None:
        """A ``run.ended`` event: the run's deadline passed and its work was stopped."""
        self._log.record(run_id=run_id, kind=RUN_ENDED, data=data)
