"""Numbers → coordinates for the inline SVG charts (the templates draw them; no JS, no CDN)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

W, H, LEFT, RIGHT, TOP, BOTTOM = 720, 220, 70, 16, 14, 34


@dataclass(frozen=True, slots=True)
class LineChart:
    width: int
    height: int
    points: str
    """SVG ``points`` of the polyline (a step line: spend jumps when a call settles)."""
    dots: list[tuple[float, float, str]]
    y_max: float
    y_ticks: list[tuple[float, str]]
    x_labels: list[tuple[float, str, str]]  # x, text, text-anchor
    plot: tuple[int, int, int, int]  # left, top, right, bottom


def spend_chart(series: list[tuple[datetime, float]], max_points: int = 400) -> LineChart | None:
    """Cumulative spend over time; None without a charged call. A long run's series is thinned
    to about ``max_points`` (it only ever rises, so every k-th point and the last keep its shape)."""
    if not series:
        return None
    if len(series) > max_points:
        step = -(-len(series) // max_points)
        series = series[::step] + ([series[-1]] if (len(series) - 1) % step else [])
    t0, t1 = series[0][0], series[-1][0]
    span = max((t1 - t0).total_seconds(), 1e-6)
    y_max = max(v for _, v in series) * 1.1 or 1.0
    right, bottom = W - RIGHT, H - BOTTOM

    def xy(at: datetime, value: float) -> tuple[float, float]:
        x = LEFT + (right - LEFT) * ((at - t0).total_seconds() / span if len(series) > 1 else 0.5)
        return round(x, 1), round(bottom - (bottom - TOP) * value / y_max, 1)

    coords: list[tuple[float, float]] = [xy(t0, 0.0)]
    dots = []
    for at, value in series:
        x, y = xy(at, value)
        coords += [(x, coords[-1][1]), (x, y)]
        dots.append((x, y, f"{at.isoformat(timespec='seconds')}: ${value:.6f}"))
    ticks = [(round(bottom - (bottom - TOP) * f, 1), f"${y_max * f:.6f}") for f in (0.0, 0.5, 1.0)]
    fmt = "%H:%M:%S" if t0.date() == t1.date() else "%m-%d %H:%M"
    labels = [(float(LEFT), t0.strftime(fmt), "start")]
    if len(series) > 1:
        labels.append((float(right), t1.strftime(fmt), "end"))
    return LineChart(W, H, " ".join(f"{x},{y}" for x, y in coords), dots, y_max, ticks, labels,
                     (LEFT, TOP, right, bottom))
