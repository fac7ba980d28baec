"""Run by tests/test_drivers_django.py in a subprocess (Django's settings are
per process): drives examples/django_app, the real Django project, against
the database in DATABASE_URL, and checks awa_pool's functions through
Django's connection inside and outside atomic(). Prints one JSON line
with what the outer test checks next. With AWA_HIDE_PSYCOPG=1, psycopg 3
cannot be imported, so Django's postgresql backend falls back to psycopg2
(and awa_pool must not need psycopg 3 either)."""
from __future__ import annotations

import json
import os
import sys

if os.environ.get("AWA_HIDE_PSYCOPG") == "1":
    sys.modules["psycopg"] = None  # type: ignore[assignment]  # `import psycopg` raises ImportError

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")

import django  # noqa: E402
from django.conf import settings  # noqa: E402

settings.DATABASES["lite"] = {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}
django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection, connections, transaction  # noqa: E402
from django.test import Client  # noqa: E402

import awa_pool  # noqa: E402
from awa_pool import Job  # noqa: E402
from shop.models import Order, Stock  # noqa: E402


def kinds() -> list:
    return [record.kind for record in reversed(awa_pool.list_jobs(connection, limit=1000))]


def expect_error(error: type, fragment: str, call) -> None:
    try:
        call()
    except error as exc:
        message = str(exc)
        assert fragment in message and "\n" not in message, message
        return
    raise AssertionError(f"expected {error.__name__} containing {fragment!r}")


def main() -> None:
    # Django's migrations create the shop's tables and, through shop's
    # 0002 migration (awa_pool.migrate on Django's connection, inside
    # Django's transaction), the job queue's schema.
    call_command("migrate", verbosity=0)
    driver = type(connection.connection).__module__.partition(".")[0]
    assert awa_pool.migrate.__module__ == "awa_pool.api.migrate"
    with transaction.atomic():
        assert awa_pool.migrate(connection) == []

    # the example view: order, receipt job and stock reservation in one atomic()
    Stock.objects.create(item="book", left=1)
    client = Client()
    placed = client.post("/orders", {"item": "book", "quantity": "1"})
    assert placed.status_code == 202, placed.content
    refused = client.post("/orders", {"item": "book", "quantity": "1"})
    assert refused.status_code == 409, refused.content
    assert Order.objects.count() == 1 and kinds() == ["send_receipt"]  # the refused order left no job

    # rolled back: nothing, whichever producer function
    with transaction.atomic():
        awa_pool.enqueue(connection, Job("rolled_back"))
        awa_pool.enqueue_many(connection, [Job("rolled_back")] * 2)
        awa_pool.enqueue_batch(connection, [Job("rolled_back")], then=Job("rolled_back"))
        transaction.set_rollback(True)
    try:
        with transaction.atomic():
            awa_pool.enqueue(connection, Job("rolled_back"))
            raise KeyError("the view failed after enqueueing")
    except KeyError:
        pass
    assert kinds() == ["send_receipt"]

    # committed: everything, including from a nested atomic() (a savepoint)
    with transaction.atomic():
        awa_pool.enqueue_many(connection, [Job("kept", {"n": n}) for n in range(2)])
        with transaction.atomic():
            batch = awa_pool.enqueue_batch(connection, [Job("member")], then=Job("follow_up"))
        with connection.cursor() as django_cursor:   # a Django cursor works too
            awa_pool.enqueue(django_cursor, Job("via_cursor"))
        assert awa_pool.queue_depth(connection)["default"].total == 6, awa_pool.queue_depth(connection)
    assert kinds() == ["send_receipt", "kept", "kept", "follow_up", "member", "via_cursor"]

    # outside atomic() Django autocommits: each call commits by itself
    outside = awa_pool.enqueue(connection, Job("autocommitted"))
    assert awa_pool.cancel_job(connection, outside) == "cancelled"
    assert [r.state for r in awa_pool.wait(connection, [outside], timeout=10)] == ["cancelled"]
    with transaction.atomic():
        expect_error(ValueError, "outside a transaction", lambda: awa_pool.wait(connection, [outside]))

    # a failed atomic() block, known to Django or only to the database
    with transaction.atomic():
        try:
            with transaction.atomic(savepoint=False):
                Order.objects.create(item="x" * 500)   # too long: DataError
        except django.db.utils.DataError:
            pass
        expect_error(ValueError, "atomic() block has already failed",
                     lambda: awa_pool.enqueue(connection, Job("x")))
    with transaction.atomic():
        raw = connection.connection.cursor()
        try:
            raw.execute("SELECT * FROM no_such_table")
        except Exception:
            pass
        expect_error(ValueError, "has already failed", lambda: awa_pool.enqueue(connection, Job("x")))
        transaction.set_rollback(True)
    expect_error(ValueError, "is a sqlite database",
                 lambda: awa_pool.enqueue(connections["lite"], Job("x")))
    expect_error(ValueError, "migrate() needs a connection that is not in autocommit mode",
                 lambda: awa_pool.migrate(connection))

    print(json.dumps({"driver": driver, "receipt_job": placed.json()["job_id"],
                      "order_id": placed.json()["order_id"], "batch_then": batch.then_id,
                      "psycopg_imported": sys.modules.get("psycopg") is not None}))


if __name__ == "__main__":
    main()
