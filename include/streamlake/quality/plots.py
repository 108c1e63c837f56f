"""Trend plots of a table's validations as inline SVG (no plotting library, no files).

:func:`trend_svg` draws, for a table's validations in time order, the pass
rate (share of its expectations met, 0-100 %, a line with one dot per
validation coloured by its verdict) above the unexpected-row counts (bars).
Every dot and bar has a ``<title>`` (time, operation, numbers), which
browsers show on hover.
"""

from __future__ import annotations

import datetime as dt
import html

COLORS = {"PASS": "#137333", "WARN": "#b06000", "FAIL": "#b3261e"}


def _fmt_time(value) -> str:
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.timezone.utc).strftime("%m-%d %H:%M:%S")
    return str(value or "")


def trend_svg(points: list[dict], title: str = "", width: int = 640, height: int = 220) -> str:
    """``points``: validation summaries oldest first, with ``validated_at``, ``pass_rate``
    (0..1), ``unexpected``, ``status`` and ``operation``. Returns an ``<svg>`` element."""
    esc = html.escape
    left, right, top, gap, bottom = 46, 12, 22, 26, 30
    plot_w = width - left - right
    rate_h = (height - top - gap - bottom) * 0.55
    bars_h = (height - top - gap - bottom) - rate_h
    rate_y0 = top + rate_h          # y of 0 %
    bars_top = rate_y0 + gap
    bars_y0 = bars_top + bars_h     # y of 0 unexpected
    out = [(f'<svg xmlns="http://www.w3.org/2000/svg" class="trend" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{esc(title or "quality trend")}">'),
           ('<style>text{font:11px system-ui,sans-serif;fill:#44505c}.grid{stroke:#e3e8ee}'
            '.axis{stroke:#9aa5b1}</style>')]
    if title:
        out.append(f'<text x="{left}" y="13" style="font-weight:600">{esc(title)}</text>')
    # axes and grid: pass rate
    for pct in (0, 50, 100):
        y = rate_y0 - rate_h * pct / 100
        out.append(f'<line class="grid" x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}"/>')
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{pct}%</text>')
    out.append(f'<text x="{left + plot_w}" y="{top - 6}" text-anchor="end">pass rate</text>')
    out.append(f'<line class="axis" x1="{left}" x2="{left + plot_w}" y1="{bars_y0:.1f}" y2="{bars_y0:.1f}"/>')
    out.append(f'<text x="{left + plot_w}" y="{bars_top - 4:.1f}" text-anchor="end">unexpected rows</text>')
    if not points:
        out.append(f'<text x="{left + plot_w / 2}" y="{rate_y0 - rate_h / 2:.1f}" text-anchor="middle">'
                   'no validations yet</text></svg>')
        return "".join(out)
    n = len(points)
    step = plot_w / max(n, 1)
    max_unexpected = max(int(p.get("unexpected") or 0) for p in points)
    out.append(f'<text x="{left - 6}" y="{bars_top + 8:.1f}" text-anchor="end">{max_unexpected}</text>')
    out.append(f'<text x="{left - 6}" y="{bars_y0:.1f}" text-anchor="end">0</text>')
    coords = []
    for i, p in enumerate(points):
        x = left + step * (i + 0.5)
        rate = max(0.0, min(1.0, float(p.get("pass_rate") or 0.0)))
        y = rate_y0 - rate_h * rate
        coords.append((x, y, p, rate))
    if n > 1:
        path = " ".join(f"{'M' if i == 0 else 'L'}{x:.1f},{y:.1f}" for i, (x, y, _, _) in enumerate(coords))
        out.append(f'<path d="{path}" fill="none" stroke="#3b6fb6" stroke-width="1.5"/>')
    bar_w = max(1.0, min(18.0, step * 0.6))
    for x, y, p, rate in coords:
        status = p.get("status") or "PASS"
        label = (f"{_fmt_time(p.get('validated_at'))} {p.get('operation', '')}: {status}, "
                 f"{rate * 100:.0f}% of {p.get('expectations', '?')} expectations met, "
                 f"{int(p.get('unexpected') or 0)} unexpected rows")
        out.append(f'<circle class="point {esc(status)}" cx="{x:.1f}" cy="{y:.1f}" r="3.5" '
                   f'fill="{COLORS.get(status, "#555")}"><title>{esc(label)}</title></circle>')
        unexpected = int(p.get("unexpected") or 0)
        if unexpected and max_unexpected:
            h = bars_h * unexpected / max_unexpected
            out.append(f'<rect class="bar" x="{x - bar_w / 2:.1f}" y="{bars_y0 - h:.1f}" width="{bar_w:.1f}" '
                       f'height="{h:.1f}" fill="#d9822b"><title>{esc(label)}</title></rect>')
    out.append(f'<text x="{left}" y="{height - 8}">{esc(_fmt_time(points[0].get("validated_at")))}</text>')
    if n > 1:
        out.append(f'<text x="{left + plot_w}" y="{height - 8}" text-anchor="end">'
                   f'{esc(_fmt_time(points[-1].get("validated_at")))}</text>')
    out.append("</svg>")
    return "".join(out)
