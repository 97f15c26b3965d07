#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Draws bus bandwidth against message size, one SVG per device collective with a panel for
N=2 and one for N=4: namedax, OpenMPI (plain and with glibc's huge-page malloc), PyTorch's
gloo collectives, the hand-written threaded exchange and the memory-traffic bound. Reads the
bench.csv written by report.py; writes <collective>.svg. Python standard library only: the SVG
is written by hand.

Usage: plot.py <bench.csv> <output dir> [N ...]     (default N: 2 4)
"""
import csv
import math
import os
import sys

COLLECTIVES = {
    "psum": "psum (all-reduce)",
    "all_gather": "all_gather",
    "psum_scatter": "psum_scatter (reduce-scatter)",
    "all_to_all": "all_to_all",
    "ppermute": "ppermute (ring)",
}
SERIES = [  # impl, label, colour, dash
    ("namedax", "namedax", "#1f77b4", ""),
    ("openmpi", "OpenMPI", "#d62728", ""),
    ("openmpi_hugetlb", "OpenMPI, hugetlb malloc", "#ff9896", "6,3"),
    ("gloo", "PyTorch gloo", "#9467bd", "4,2"),
    ("hand_threads", "hand-written threads", "#2ca02c", "2,3"),
    ("memory_bound", "memory-traffic bound", "#7f7f7f", "8,4"),
]
PANEL_W, PANEL_H = 420, 300
MARGIN_L, MARGIN_R, MARGIN_T, MARGIN_B = 70, 20, 50, 55
LEGEND_H = 70


def size_label(b):
    if b >= 1 << 20:
        return f"{b >> 20} MiB"
    if b >= 1024:
        return f"{b >> 10} KiB"
    return f"{b} B"


def bw_label(v):
    if v >= 1:
        return f"{v:g}"
    return f"{v:.0e}".replace("e-0", "e-")


def esc(text):
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def load(path):
    data = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            bw = float(r["bus_GBps"])
            if bw <= 0:
                continue
            key = (r["collective"], int(r["devices"]), r["impl"])
            data.setdefault(key, []).append((int(r["bytes"]), bw))
    return data


def panel(out, x0, y0, title, curves, xmin, xmax, ymin, ymax):
    """One log-log panel whose plot area's top-left corner is (x0, y0)."""
    w, h = PANEL_W - MARGIN_L - MARGIN_R, PANEL_H - MARGIN_T - MARGIN_B
    lx0, lx1 = math.log2(xmin), math.log2(xmax)
    ly0, ly1 = math.log10(ymin), math.log10(ymax)

    def px(b):
        return x0 + (math.log2(b) - lx0) / (lx1 - lx0) * w

    def py(v):
        return y0 + h - (math.log10(v) - ly0) / (ly1 - ly0) * h

    out.append(f'<text x="{x0 + w / 2:.1f}" y="{y0 - 12}" text-anchor="middle" font-size="14" '
               f'font-weight="bold">{esc(title)}</text>')
    out.append(f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" stroke="#000"/>')
    # x ticks at every power of 4 bytes from xmin to xmax (4 B, 16 B, ..., 64 MiB)
    b = xmin
    while b <= xmax:
        x = px(b)
        out.append(f'<line x1="{x:.1f}" y1="{y0}" x2="{x:.1f}" y2="{y0 + h}" stroke="#ddd"/>')
        if math.log2(b) % 4 == 2 or b in (xmin, xmax):  # label 4 B, 64 B, 1 KiB, 16 KiB, ...
            out.append(f'<text x="{x:.1f}" y="{y0 + h + 16}" text-anchor="middle" font-size="11">{size_label(b)}</text>')
        b *= 4
    for e in range(int(math.floor(ly0)), int(math.ceil(ly1)) + 1):
        v = 10.0 ** e
        if v < ymin or v > ymax:
            continue
        y = py(v)
        out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + w}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11">{bw_label(v)}</text>')
    out.append(f'<text x="{x0 + w / 2:.1f}" y="{y0 + h + 36}" text-anchor="middle" font-size="12">'
               f'message size per device</text>')
    out.append(f'<text x="{x0 - 50}" y="{y0 + h / 2:.1f}" text-anchor="middle" font-size="12" '
               f'transform="rotate(-90 {x0 - 50} {y0 + h / 2:.1f})">bus bandwidth (GB/s)</text>')
    for impl, _label, colour, dash in SERIES:
        points = sorted(curves.get(impl, []))
        if not points:
            continue
        coords = " ".join(f"{px(b):.1f},{py(min(max(v, ymin), ymax)):.1f}" for b, v in points)
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(f'<polyline points="{coords}" fill="none" stroke="{colour}" stroke-width="2"{dash_attr}/>')
        for b, v in points:
            out.append(f'<circle cx="{px(b):.1f}" cy="{py(min(max(v, ymin), ymax)):.1f}" r="3" fill="{colour}"/>')


def plot(data, collective, devices, path):
    curves = {n: {impl: data.get((collective, n, impl), []) for impl, *_ in SERIES} for n in devices}
    values = [v for n in devices for pts in curves[n].values() for _, v in pts]
    sizes = [b for n in devices for pts in curves[n].values() for b, _ in pts]
    if not values:
        return False
    xmin, xmax = min(sizes), max(sizes)
    if xmin == xmax:
        xmax = xmin * 4
    ymin = 10.0 ** math.floor(math.log10(min(values)))
    ymax = 10.0 ** math.ceil(math.log10(max(values)))
    if ymin == ymax:
        ymax = ymin * 10
    width, height = PANEL_W * len(devices), PANEL_H + LEGEND_H
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif">',
           f'<rect width="{width}" height="{height}" fill="#fff"/>']
    for k, n in enumerate(devices):
        panel(out, k * PANEL_W + MARGIN_L, MARGIN_T, f"{COLLECTIVES[collective]}, N = {n}", curves[n], xmin, xmax, ymin,
              ymax)
    # legend below the panels, three entries per row
    for k, (impl, label, colour, dash) in enumerate(SERIES):
        x = MARGIN_L + (k % 3) * 260
        y = PANEL_H + 12 + (k // 3) * 22
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(f'<line x1="{x}" y1="{y}" x2="{x + 30}" y2="{y}" stroke="{colour}" stroke-width="2"{dash_attr}/>')
        out.append(f'<circle cx="{x + 15}" cy="{y}" r="3" fill="{colour}"/>')
        out.append(f'<text x="{x + 38}" y="{y + 4}" font-size="12">{esc(label)}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
    return True


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    data = load(sys.argv[1])
    devices = [int(a) for a in sys.argv[3:]] or [2, 4]
    os.makedirs(sys.argv[2], exist_ok=True)
    for c in COLLECTIVES:
        path = os.path.join(sys.argv[2], f"{c}.svg")
        if plot(data, c, devices, path):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
