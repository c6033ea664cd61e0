"""What an audit check is given: the gym's store and config, and the run under audit."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kit.config import GymConfig
from kit.settings import ProviderSecrets
from services.records.events import EventLog, RecordEvent
from storage.store import Store


@dataclass
class AuditContext:
    store: Store
    config: GymConfig
    data_dir: Path
    events: EventLog
    run_id: str
    secrets: ProviderSecrets | None = None
    """Provider keys for an in-process LLM judge (read at call time, never stored)."""
    gateway_url: str | None = None
    """Where the judge's calls go when set (through rollout, metered): the records service itself
    then needs no provider key."""
    models_dir: Path | None = None
    """Where the gym keeps its base models (None: the machine's default): the contamination check
    decodes a custom loss's token ids with its base model's tokenizer."""

    def run_events(self, *kinds: str) -> list[RecordEvent]:
        """The run's platform events in order (only ``kinds`` when given)."""
        return self.events.events(self.run_id, kinds=kinds or None)
