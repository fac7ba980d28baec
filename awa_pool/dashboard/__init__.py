"""The web dashboard (SPEC §8): `create_app()` returns a WSGI app (Flask)
showing queues, jobs, attempts and their cost, kinds, cron and dead
letters, with the operator actions.

Needs the `dashboard` extra (Flask, Jinja2, waitress). `import awa_pool`
never imports this package; `awa-pool dashboard` serves it with waitress.
"""
from __future__ import annotations

from .app import create_app

__all__ = ["create_app"]
