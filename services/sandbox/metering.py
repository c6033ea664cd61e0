"""Sandbox time is paid ahead, slice by slice, through the ledger.

A sandbox may only run while a reservation covers it: the first slice is reserved before
it starts; a little before each slice ends the next one is reserved, and only then is the
finished slice settled at what it really used. When the next slice cannot be reserved the
sandbox is killed (fail closed), so a key never pays for more than it holds and a sandbox
never runs unpaid for longer than the supervisor's tick.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field

from billing.ledger import Ledger


def nusd_per_second(usd_per_hour: float) -> int:
    return math.ceil(usd_per_hour * 1e9 / 3600)


@dataclass
class SliceMeter:
    ledger: Ledger
    key_id: str
    chain_ids: tuple[str, ...]
    sandbox_id: str
    price_nusd_per_s: int
    slice_s: float
    reservation_id: str | None = None
    slice_started: float = 0.0
    paid_until: float = 0.0
    seconds: float = 0.0
    charged_nusd: int = 0
    closed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _reserve(self) -> str:
        return self.ledger.reserve(
            self.key_id, service="sandbox", operation="sandbox.seconds", ref_id=self.sandbox_id,
            estimate_nusd=math.ceil(self.price_nusd_per_s * self.slice_s), chain_ids=self.chain_ids,
        ).id

    def open(self) -> None:
        """Reserve the first slice (raises BudgetExhausted: the sandbox must not start)."""
        with self.lock:
            self.reservation_id = self._reserve()
            self.slice_started = time.monotonic()
            self.paid_until = self.slice_started + self.slice_s

    def restart_clock(self) -> None:
        """The sandbox has just started: its first slice begins now, not at the reservation."""
        with self.lock:
            self.slice_started = time.monotonic()
            self.paid_until = self.slice_started + self.slice_s

    def due(self, now: float, lead_s: float) -> bool:
        return not self.closed and now >= self.paid_until - lead_s

    def advance(self) -> None:
        """Reserve the next slice, then settle the one that is ending. Raises BudgetExhausted.

        Called up to one supervisor tick before the slice ends: the ending slice is settled
        in full (the sandbox keeps running through it) and the next begins where it ends.
        """
        with self.lock:
            if self.closed:
                return
            nxt = self._reserve()
            now = time.monotonic()
            self._settle(self.paid_until - self.slice_started)
            self.reservation_id = nxt
            self.slice_started = max(self.paid_until, now)
            self.paid_until = self.slice_started + self.slice_s

    def close(self) -> tuple[float, int]:
        """Settle what the current slice used; returns (seconds, charged nano-USD) in total."""
        with self.lock:
            if not self.closed:
                self.closed = True
                now = time.monotonic()
                self._settle(min(max(0.0, now - self.slice_started), self.slice_s))
            return self.seconds, self.charged_nusd

    def _settle(self, used_s: float) -> None:
        if self.reservation_id is None:
            return
        # A slice never costs more than its reservation: float rounding of paid_until - slice_started
        # must not show up as a 1 nUSD overrun on the ledger.
        cost = min(math.ceil(self.price_nusd_per_s * used_s), math.ceil(self.price_nusd_per_s * self.slice_s))
        self.charged_nusd += self.ledger.settle(self.reservation_id, cost)
        self.seconds += used_s
        self.reservation_id = None
