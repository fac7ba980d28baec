"""Handlers for the dashboard's browser test: a job that fails with a real
traceback until a file exists (so pressing Retry in the page makes it
complete), and a quick one for watching a paused queue."""
from __future__ import annotations

import os

import awa_pool


@awa_pool.task("flaky_upload", queue="uploads", max_attempts=1)
def flaky_upload(path: str, ok_file: str) -> dict:
    if not os.path.exists(ok_file):
        raise ConnectionError(f"upload of {path} refused: the storage is read-only")
    return {"uploaded": path}


@awa_pool.task("quick", queue="uploads")
def quick(**args) -> dict:
    return {"args": args}
