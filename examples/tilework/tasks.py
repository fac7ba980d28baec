"""The example app's tasks: the module a supervisor loads with
`awa-pool start --app tilework.tasks`.

render_tile  CPU-heavy, pure Python: computes one band of a Mandelbrot
             image. The bands run in parallel, one per child process,
             with no GIL between them.
assemble     the follow-up of a batch of tiles: reads every tile's result
             with ctx.batch_results() and joins them into one picture.
send_digest  an ordinary I/O-style background job, fired every hour by a
             periodic schedule (and enqueued once by the quickstart).
"""
from __future__ import annotations

import logging
import math
import os
import time

import awa_pool

log = logging.getLogger(__name__)

PALETTE = " .:-=+*#%@"   # from "escaped at once" to "never escaped"


@awa_pool.task("render_tile", queue="render", max_attempts=3, timeout=300)
def render_tile(band: int, bands: int, width: int = 100, height: int = 40,
                max_iter: int = 5000, samples: int = 3) -> dict:
    """Rows [band*height/bands, (band+1)*height/bands) of a width x height
    character picture of the Mandelbrot set, each character averaging
    samples x samples points. Returns the rows and what it cost."""
    started, cpu_started = time.monotonic(), time.process_time()
    first = band * height // bands
    last = (band + 1) * height // bands
    rows = []
    for y in range(first, last):
        row = []
        for x in range(width):
            escaped_total = 0.0
            for sy in range(samples):
                for sx in range(samples):
                    # the view: real -2.2..0.8, imaginary -1.2..1.2
                    c_re = -2.2 + 3.0 * (x + (sx + 0.5) / samples) / width
                    c_im = -1.2 + 2.4 * (y + (sy + 0.5) / samples) / height
                    z_re = z_im = 0.0
                    n = 0
                    while n < max_iter and z_re * z_re + z_im * z_im <= 4.0:
                        z_re, z_im = z_re * z_re - z_im * z_im + c_re, 2.0 * z_re * z_im + c_im
                        n += 1
                    escaped_total += n / max_iter
            # log scale: most points escape within a few iterations
            shade = math.log1p(escaped_total / (samples * samples) * max_iter) / math.log1p(max_iter)
            row.append(PALETTE[min(len(PALETTE) - 1, int(shade * (len(PALETTE) - 1)))])
        rows.append("".join(row))
    return {"band": band, "rows": rows, "pid": os.getpid(),
            "cpu_s": round(time.process_time() - cpu_started, 3),
            "wall_s": round(time.monotonic() - started, 3)}


@awa_pool.task("assemble", queue="render", max_attempts=3, pass_context=True)
def assemble(ctx: awa_pool.JobContext, title: str = "mandelbrot") -> dict:
    """Join the tiles of the batch this job follows, in band order."""
    tiles = ctx.batch_results()
    failed = [tile.id for tile in tiles if tile.state != "completed"]
    if failed:
        raise awa_pool.Cancel(f"tiles {failed} did not complete; nothing to assemble")
    results = sorted((tile.result for tile in tiles), key=lambda result: result["band"])
    rows = [row for result in results for row in result["rows"]]
    return {"title": title, "rows": rows, "tiles": len(results),
            "children": sorted({result["pid"] for result in results}),
            "cpu_s": round(sum(result["cpu_s"] for result in results), 3)}


@awa_pool.task("send_digest", queue="default", max_attempts=5)
def send_digest(to: str) -> dict:
    """Stands in for an email or a webhook: the usual small background job."""
    log.info("sending the render digest to %s", to)
    return {"sent_to": to}


# Registered in the database when a pool starts; exactly one fire per tick
# across all supervisors. A bad expression or time zone fails here, at import.
awa_pool.periodic("hourly_digest", "0 * * * *", "send_digest", {"to": "ops@example.com"},
                  timezone="UTC", missed_fire_policy="coalesce")
