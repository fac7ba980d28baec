"""tilework: the awa_pool example app (see the README's "The example app").

`database_url()` is how the example finds Postgres, the same way the
awa-pool command does: $AWA_DATABASE_URL, else $DATABASE_URL, else the
embedded PostgreSQL server (started on first use, data kept in the user's
data directory or $AWA_EMBEDDED_DIR).
"""
from __future__ import annotations

import os


def database_url(announce: bool = False) -> str:
    for name in ("AWA_DATABASE_URL", "DATABASE_URL"):
        if os.environ.get(name):
            return os.environ[name]
    from awa_pool.core import embedded

    url = embedded.start()
    if announce:
        print(f"using the embedded Postgres (data in {embedded.default_data_dir()})")
    return url
