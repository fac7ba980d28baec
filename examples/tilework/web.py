"""A web handler that enqueues in the same transaction as its own write
(stdlib WSGI, so the example needs no web framework).

    PYTHONPATH=examples python -m tilework.web          # serves on :8000
    curl -X POST 'localhost:8000/renders?title=hello'    # -> 202 {"render_id": 1, "job_id": ...}
    curl localhost:8000/renders/1                        # -> the picture once assembled

POST /renders inserts a row in the app's own `renders` table and enqueues
the tile jobs plus their `assemble` follow-up in ONE transaction: if the
INSERT fails, or anything raises before the commit, no job exists; once
the commit returns, a supervisor is woken (NOTIFY) and starts on the tiles
within milliseconds. The same pattern works with Django
(`awa_pool.enqueue(django.db.connection, job)` inside `transaction.atomic()`)
and SQLAlchemy (`session.connection().connection`).
"""
from __future__ import annotations

import json
import re
from typing import Any, Callable, Iterable, List, Tuple
from urllib.parse import parse_qs
from wsgiref.simple_server import make_server

import psycopg2

import awa_pool
from tilework import database_url
from tilework.tasks import assemble, render_tile

BANDS = 8
SCHEMA = """
CREATE TABLE IF NOT EXISTS renders (
    id          bigserial PRIMARY KEY,
    title       text NOT NULL,
    job_id      bigint,
    created_at  timestamptz NOT NULL DEFAULT now()
)"""

StartResponse = Callable[[str, List[Tuple[str, str]]], Any]


class App:
    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        conn = psycopg2.connect(dsn)
        with conn, conn.cursor() as cur:
            cur.execute(SCHEMA)
        conn.close()

    def __call__(self, environ: dict, start_response: StartResponse) -> Iterable[bytes]:
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "/")
        if method == "POST" and path == "/renders":
            title = parse_qs(environ.get("QUERY_STRING", "")).get("title", ["mandelbrot"])[0]
            return self.reply(start_response, "202 Accepted", self.create_render(title))
        match = re.fullmatch(r"/renders/(\d+)", path)
        if method == "GET" and match:
            return self.reply(start_response, "200 OK", self.show_render(int(match.group(1))))
        return self.reply(start_response, "404 Not Found", {"error": "not found"})

    def create_render(self, title: str) -> dict:
        # A real app would take a connection from a pool (psycopg2.pool).
        conn = psycopg2.connect(self.dsn)
        try:
            with conn:  # one transaction: the row and the jobs commit together
                with conn.cursor() as cur:
                    cur.execute("INSERT INTO renders (title) VALUES (%s) RETURNING id", (title,))
                    render_id = cur.fetchone()[0]
                batch = awa_pool.enqueue_batch(
                    conn, [render_tile.job(band=band, bands=BANDS) for band in range(BANDS)],
                    then=assemble.job(title=title))
                with conn.cursor() as cur:
                    cur.execute("UPDATE renders SET job_id = %s WHERE id = %s", (batch.then_id, render_id))
        finally:
            conn.close()
        return {"render_id": render_id, "job_id": batch.then_id, "tiles": batch.ids}

    def show_render(self, render_id: int) -> dict:
        conn = psycopg2.connect(self.dsn)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT job_id FROM renders WHERE id = %s", (render_id,))
                row = cur.fetchone()
            if row is None:
                return {"error": f"no render {render_id}"}
            job = awa_pool.get_job(conn, row[0])
        finally:
            conn.close()
        picture = "\n".join(job.result["rows"]) if job.result else None
        return {"render_id": render_id, "state": job.state.value, "picture": picture}

    @staticmethod
    def reply(start_response: StartResponse, status: str, body: dict) -> List[bytes]:
        data = json.dumps(body, indent=2).encode()
        start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
        return [data]


def main() -> None:
    dsn = database_url(announce=True)
    with make_server("", 8000, App(dsn)) as server:
        print("serving on http://localhost:8000 (POST /renders, GET /renders/ID); Ctrl-C stops")
        server.serve_forever()


if __name__ == "__main__":
    main()
