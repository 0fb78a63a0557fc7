"""Small line charts as inline SVG (for the HTML page of a journey): no script, no external file."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

WIDTH, HEIGHT, PAD = 360, 120, 28
LEFT = 40  # room for a y label as tick() writes it ("2.26k", "0.000123")
TITLE_CHARS = (WIDTH - LEFT) // 6  # a title's characters that fit (10 px monospace: 6 px a character)


def tick(value: float) -> str:
    """An axis label that fits its room: whole numbers whole, thousands as "12.3k", else 3 figures."""
    if abs(value) >= 1000:
        return f"{value / 1000:.3g}k"
    if value == int(value):
        return str(int(value))
    return f"{value:.3g}" if abs(value) >= 1e-3 else f"{value:.0e}"


def line_chart(
    title: str,
    xs: Sequence[float],
    series: Sequence[tuple[str, Sequence[float], str]],
    y_label: str = "",
    y_range: tuple[float, float] | None = None,
) -> str:
    """An SVG line chart of one or more `series` (name, values, colour) over `xs`, with its axes'
    ranges written at their ends; the y axis over `y_range` where given (a probability's 0 to 1),
    else from 0 to the values'. Empty when there is nothing to draw."""
    points = [(x, y) for _, ys, _ in series for x, y in zip(xs, ys)]
    if not points:
        return ""
    x0, x1 = min(x for x, _ in points), max(x for x, _ in points)
    y0, y1 = y_range or (min(0.0, min(y for _, y in points)), max(y for _, y in points))
    x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + 1)

    def at(x: float, y: float) -> str:
        px = LEFT + (x - x0) / (x1 - x0) * (WIDTH - LEFT - PAD)
        py = HEIGHT - PAD + (y0 - y) / (y1 - y0) * (HEIGHT - 2 * PAD)
        return f"{px:.1f},{py:.1f}"

    lines = [
        f'<polyline fill="none" stroke="{escape(color)}" stroke-width="1.5" '
        f'points="{" ".join(at(x, y) for x, y in zip(xs, ys))}"><title>{escape(name)}</title></polyline>'
        for name, ys, color in series
        if len(ys)
    ]
    legend = " · ".join(f'<tspan fill="{escape(color)}">{escape(name)}</tspan>' for name, _, color in series)
    return (
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img">'
        f"<title>{escape(title)}</title>"
        f'<text x="{LEFT}" y="12" class="chart-title">{escape(title)}</text>'
        f'<text x="{WIDTH - PAD}" y="24" text-anchor="end" class="chart-legend">{legend}</text>'
        f'<line x1="{LEFT}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD}" y2="{HEIGHT - PAD}" class="axis"/>'
        f'<line x1="{LEFT}" y1="{PAD}" x2="{LEFT}" y2="{HEIGHT - PAD}" class="axis"/>'
        f'<text x="{LEFT - 3}" y="{HEIGHT - PAD}" text-anchor="end" class="tick">{tick(y0)}</text>'
        f'<text x="{LEFT - 3}" y="{PAD + 4}" text-anchor="end" class="tick">{tick(y1)}</text>'
        f'<text x="{LEFT}" y="{HEIGHT - PAD + 12}" class="tick">{tick(x0)}</text>'
        f'<text x="{WIDTH - PAD}" y="{HEIGHT - PAD + 12}" text-anchor="end" class="tick">{tick(x1)}</text>'
        f'<text x="{WIDTH / 2}" y="{HEIGHT - 4}" text-anchor="middle" class="tick">{escape(y_label)}</text>'
        + "".join(lines)
        + "</svg>"
    )
