"""The moderation burst on the virtual clock, at the demo's size times `--scale`.

`python -m bench.moderation --scale 1 --scale 10 --scale 100 --out bench/results/moderation.json`

Each scale runs the pipeline's own stages (classes, bounds, admission, fair tags, records,
derivative sets) with `ModelWork` (each stage waits as long as the media code takes) on the
memory store and the virtual-time loop: headrace's order, the same burst without its heavy
contributors (to measure what they cost a latecomer), and FIFO over the same slots. A deployment
sized for the event: `scale` workers of the default slots, admission per event and each scan and
derive stage's bound `scale` times the default (per session stays as it is). Printed as a
table, saved as JSON.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console
from rich.table import Table

import headrace as hr
from headrace.pipelines.moderation.burst import Burst, BurstReport, run_burst
from headrace.pipelines.moderation.media import open_media
from headrace.pipelines.moderation.model import MEASURED, ModelWork, tiny_payloads
from headrace.pipelines.moderation.pipeline import Admission, Moderation, Order
from headrace.runtime.classes import DEFAULT_CLASSES
from headrace.sim.loop import VirtualTimeLoop

T = TypeVar("T")
DEFAULT_OUT = Path(__file__).parent / "results" / "moderation.json"
SCRATCH = Path("/dev/shm") if Path("/dev/shm").is_dir() else None


async def one(burst: Burst, order: Order) -> BurstReport:
    with tempfile.TemporaryDirectory(prefix="headrace-burst-", dir=SCRATCH) as scratch:
        app = hr.App("memory://")
        admission = Admission(
            per_event=Admission.per_event * burst.scale,
            stage_bound=Admission.stage_bound * burst.scale,  # 10 per slot, as by default
        )
        moderation = Moderation(
            app,
            open_media(scratch),
            None,  # ModelWork scans nothing
            work=ModelWork(),
            order=order,
            admission=admission,
        )
        async with app:
            slots = sum(DEFAULT_CLASSES.values()) if order == "fifo" else None
            return await run_burst(
                moderation, burst, tiny_payloads(), workers=burst.scale, slots=slots
            )


def virtual(coroutine: Coroutine[Any, Any, T]) -> T:
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(coroutine)
    finally:
        loop.close()


def measure(scale: int) -> dict[str, Any]:
    burst = Burst(scale=scale)
    began = time.perf_counter()
    fair = virtual(one(burst, "fair"))
    alone = virtual(one(replace(burst, heavy_photos=0), "fair"))
    fifo = virtual(one(burst, "fifo"))
    return {
        "scale": scale,
        "uploads": burst.size,
        "workers": scale,
        "real_seconds": round(time.perf_counter() - began, 1),
        "heavy_delay_s": round(fair.heavy_delay(alone), 3),
        "photo_processing_s": round(MEASURED[next(iter(MEASURED))].total, 3),
        "fair": _brief(fair.as_json()),
        "without_heavy": _brief(alone.as_json()),
        "fifo": _brief(fifo.as_json()),
    }


def _brief(report: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in report.items() if k not in ("depths", "latecomer_latency_s")}


def table(results: list[dict[str, Any]]) -> Table:
    out = Table(title="Moderation burst on the virtual clock (ModelWork, memory store)")
    for column in ("measure", *(f"x{r['scale']} {o}" for r in results for o in ("fair", "FIFO"))):
        out.add_column(column, justify="left" if column == "measure" else "right")
    rows: list[tuple[str, Callable[[dict[str, Any]], object]]] = [
        ("uploads", lambda r: r["uploads"]),
        ("settled in, s", lambda r: r["makespan_s"]),
        ("first reviewable photo at, s", lambda r: r["first_reviewable_photo"]["at"]),
        ("first photo latency / processing", lambda r: r["first_photo_latency_over_processing"]),
        ("p95 queue age image, s", lambda r: r["queue_age_p95_s"]["image"]),
        ("p95 queue age audio, s", lambda r: r["queue_age_p95_s"]["audio"]),
        ("p95 queue age video, s", lambda r: r["queue_age_p95_s"]["video"]),
        ("Jain's index, crowd", lambda r: r["jain_index_crowd"]),
        ("duplicate derivative sets", lambda r: r["duplicate_derivatives"]),
        ("admission refusals", lambda r: sum(r["admission_refusals"].values())),
    ]
    for name, value in rows:
        cells = [str(value(r[order])) for r in results for order in ("fair", "fifo")]
        out.add_row(name, *cells)
    delays = [cell for r in results for cell in (f"{r['heavy_delay_s']}", "")]
    out.add_row("heavy's delay on a latecomer, s", *delays)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--scale", type=int, action="append", help="default: 1 and 100")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    console = Console()
    results: list[dict[str, Any]] = []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for scale in args.scale or [1, 100]:
        results.append(measure(scale))
        done = results[-1]
        console.print(
            f"x{scale}: {done['uploads']} uploads in {done['real_seconds']} s of real time; "
            f"heavy's delay {done['heavy_delay_s']} s"
        )
        args.out.write_text(json.dumps(results, indent=2) + "\n")  # each scale as it ends
    console.print(table(results))
    console.print(f"saved to {args.out}")


if __name__ == "__main__":
    main()
