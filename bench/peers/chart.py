"""The peer benchmark as a picture: no-op tasks per second at one and four worker processes,
and enqueue -> start at the median (the 99th percentile marked), one row per system."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt

from bench.peers.harness import PeerFigures, medians

HEADRACE = "#c2410c"
PEER = "#64748b"


def draw(figures: PeerFigures, path: Path, caption: str) -> None:
    names = [system.name for system in figures.systems]
    rows = range(len(names))
    fig, (rates, waits) = plt.subplots(1, 2, figsize=(11, 0.45 * len(names) + 2.2), sharey=True)
    drains = medians(figures)
    for offset, processes, alpha in ((-0.2, 1, 0.5), (0.2, 4, 1.0)):
        found = {d.system: d.tasks_per_s for d in drains.values() if d.processes == processes}
        rates.barh(
            [row + offset for row in rows],
            [found.get(name, 0.0) for name in names],
            height=0.38,
            color=[_colour(name) for name in names],
            alpha=alpha,
        )
    runs = f", median of {figures.runs} runs" if figures.runs > 1 else ""
    rates.set_title(f"No-op tasks per second ({figures.tasks:,} queued, then drained{runs})")
    rates.set_xlabel("tasks / s (lighter: 1 process, darker: 4)")
    latency = {lat.system: lat for lat in figures.latency if lat.error is None}
    p50 = [latency[name].p50_ms if name in latency else 0.0 for name in names]
    p99 = [latency[name].p99_ms if name in latency else 0.0 for name in names]
    waits.barh(list(rows), p50, height=0.5, color=[_colour(name) for name in names])
    waits.scatter(p99, list(rows), marker="|", s=200, color="black")
    waits.set_title("Enqueue -> start on an idle worker, p50")
    waits.set_xlabel("ms (| marks p99)")
    rates.set_yticks(list(rows), names)
    rates.invert_yaxis()
    for axes in (rates, waits):
        axes.grid(axis="x", alpha=0.3)
        axes.set_axisbelow(True)
    fig.suptitle(caption, fontsize=9, y=0.02, va="bottom")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _colour(name: str) -> str:
    return HEADRACE if name.startswith("headrace") else PEER
