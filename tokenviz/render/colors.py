"""Colour ramps from a theme's stops, as ready-made hex strings (index = quantised value)."""

from __future__ import annotations

Rgb = tuple[int, int, int]


def parse_hex(color: str) -> Rgb:
    color = color.strip().lstrip("#")
    if len(color) == 3:
        color = "".join(c * 2 for c in color)
    return int(color[0:2], 16), int(color[2:4], 16), int(color[4:6], 16)


def _hex(rgb: Rgb) -> str:
    return "#{:02x}{:02x}{:02x}".format(*rgb)


def luminance(rgb: Rgb) -> float:
    """WCAG's relative luminance of an sRGB colour (0 black … 1 white)."""

    def linear(c: int) -> float:
        c_ = c / 255
        return c_ / 12.92 if c_ <= 0.03928 else ((c_ + 0.055) / 1.055) ** 2.4

    r, g, b = rgb
    return 0.2126 * linear(r) + 0.7152 * linear(g) + 0.0722 * linear(b)


def contrast(a: Rgb, b: Rgb) -> float:
    """WCAG's contrast ratio of two colours, 1 to 21 (text wants 4.5, a control's parts 3)."""
    light, dark = sorted((luminance(a), luminance(b)), reverse=True)
    return (light + 0.05) / (dark + 0.05)


def legible_on(background: str) -> str:
    """Black or white, whichever reads better on `background` (at least 4.5:1 on any colour)."""
    rgb = parse_hex(background)
    return "#000000" if contrast(rgb, (0, 0, 0)) >= contrast(rgb, (255, 255, 255)) else "#ffffff"


def ramp(stops: list[str], n: int = 64) -> list[str]:
    """`n` colours evenly interpolated through `stops` (hex strings), low to high."""
    rgb = [parse_hex(s) for s in stops]
    if len(rgb) == 1:
        return [_hex(rgb[0])] * n
    out = []
    for i in range(n):
        x = i / (n - 1) * (len(rgb) - 1)
        j = min(int(x), len(rgb) - 2)
        t = x - j
        a, b = rgb[j], rgb[j + 1]
        out.append(
            _hex((round(a[0] + (b[0] - a[0]) * t), round(a[1] + (b[1] - a[1]) * t), round(a[2] + (b[2] - a[2]) * t)))
        )
    return out
