"""The soak's samples over time as a small SVG, written by hand (no plotting library is installed).

Owns only turning ``bench/soak.py``'s result into SVG text: one panel per series (RSS, descriptors,
threads or goroutines, upstream connections), time in minutes along the bottom, a dashed line
at each fault and a dot at each quiet sample (the reference and the end). Must not read or write
files.
"""

from __future__ import annotations

from typing import Any
from xml.sax.saxutils import escape

_WIDTH, _PANEL_HEIGHT, _LEFT, _RIGHT, _TOP = 640, 110, 60, 20, 24
_SERIES = (
    ("rss_mib", "RSS MiB", "#1f77b4"),
    ("fds", "descriptors", "#ff7f0e"),
    ("goroutines", "goroutines", "#2ca02c"),
    ("threads", "OS threads", "#2ca02c"),
    ("upstream_connections", "upstream conns", "#d62728"),
)


def svg_plot(result: dict[str, Any]) -> str:
    samples: list[dict[str, Any]] = result["samples"]
    quiet: dict[str, dict[str, Any]] = result["quiet"]
    has_goroutines = any(s.get("goroutines") is not None for s in samples)
    series = [s for s in _SERIES if s[0] != ("threads" if has_goroutines else "goroutines")]
    span = max([s["t"] for s in samples] + [q["t"] for q in quiet.values()] + [1.0])
    height = _TOP + len(series) * _PANEL_HEIGHT + 30
    inner = _WIDTH - _LEFT - _RIGHT
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{height}" '
        f'font-family="sans-serif" font-size="11">',
        f'<rect width="{_WIDTH}" height="{height}" fill="white"/>',
        f'<text x="{_LEFT}" y="14">soak: {escape(f"{span / 60:.1f}")} min; dashed: faults '
        "(b blackhole, r restart); dots: quiet samples</text>",
    ]

    def x_of(t: float) -> float:
        return float(_LEFT + inner * t / span)

    for index, (key, label, colour) in enumerate(series):
        top = _TOP + index * _PANEL_HEIGHT
        bottom = top + _PANEL_HEIGHT - 22
        points = [(s["t"], s[key]) for s in samples if s.get(key) is not None]
        values = [v for _, v in points] + [q[key] for q in quiet.values() if q.get(key) is not None]
        high = max(values + [1.0]) * 1.1

        def y_of(v: float, top: float = top, bottom: float = bottom, high: float = high) -> float:
            return bottom - (bottom - top) * v / high

        out.append(f'<line x1="{_LEFT}" y1="{bottom}" x2="{_WIDTH - _RIGHT}" y2="{bottom}" stroke="#888"/>')
        out.append(f'<line x1="{_LEFT}" y1="{top}" x2="{_LEFT}" y2="{bottom}" stroke="#888"/>')
        out.append(f'<text x="4" y="{top + 10}">{escape(label)}</text>')
        out.append(f'<text x="{_LEFT - 4}" y="{top + 10}" text-anchor="end">{high:.0f}</text>')
        out.append(f'<text x="{_LEFT - 4}" y="{bottom}" text-anchor="end">0</text>')
        for t, kind in result["faults"]:
            x = x_of(t)
            dashed = 'stroke="#aaa" stroke-dasharray="3,3"'
            out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" {dashed}/>')
            if index == 0:
                out.append(f'<text x="{x + 2:.1f}" y="{top + 10}" fill="#777">{escape(kind[0])}</text>')
        if points:
            path = " ".join(f"{x_of(t):.1f},{y_of(v):.1f}" for t, v in points)
            out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.2" points="{path}"/>')
        for q in quiet.values():
            if q.get(key) is not None:
                out.append(f'<circle cx="{x_of(q["t"]):.1f}" cy="{y_of(q[key]):.1f}" r="3" fill="{colour}"/>')
    axis = _TOP + len(series) * _PANEL_HEIGHT - 8
    for tick in range(int(span // 60) + 1):
        x = x_of(tick * 60.0)
        out.append(f'<text x="{x:.1f}" y="{axis}" text-anchor="middle">{tick} min</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
