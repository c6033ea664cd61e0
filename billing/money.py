"""Money is held as integer nano-USD everywhere inside the gym.

Integers make the ledger exact (rows always sum to ``spent``) and let one SQL statement
compare and move amounts on SQLite and PostgreSQL alike. USD floats exist only at the edges
(JSON bodies, headers, CLI).
"""

from __future__ import annotations

from decimal import ROUND_CEILING, Decimal
from functools import lru_cache

NANO = 1_000_000_000


def usd_to_nusd(usd: float | int | str | Decimal) -> int:
    """USD amount → nano-USD, rounding *up* so an estimate is never below the truth."""
    value = Decimal(str(usd))
    if not value.is_finite():
        raise ValueError("amount must be finite")
    return int((value * NANO).to_integral_value(rounding=ROUND_CEILING))


def nusd_to_usd(nusd: int) -> float:
    return round(nusd / NANO, 9)


def token_cost_nusd(tokens: int, usd_per_mtok: float | Decimal) -> int:
    """Cost of ``tokens`` at a per-million-token price, rounded up to the nano-dollar."""
    if tokens <= 0:
        return 0
    value = Decimal(tokens) * _nusd_per_token(usd_per_mtok)
    return int(value.to_integral_value(rounding=ROUND_CEILING))


@lru_cache(maxsize=256)
def _nusd_per_token(usd_per_mtok: float | Decimal) -> Decimal:
    """1 USD per million tokens = 1000 nano-USD per token (exact: the price as written). A gym has
    a few prices, and each call costs its tokens at two of them, twice (estimate, then cost)."""
    return Decimal(str(usd_per_mtok)) * 1000


def format_usd(nusd: int) -> str:
    """Header form: fixed nine decimals, no exponent."""
    return f"{nusd / NANO:.9f}"
