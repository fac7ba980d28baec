"""The shop's background job. A worker runs it with

    DJANGO_SETTINGS_MODULE=shop.settings awa-pool start --app shop.tasks

(from examples/django_app). Django is set up when this module is imported,
so the handler can use the ORM in the pool's child processes."""
from __future__ import annotations

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")
django.setup()

import awa_pool  # noqa: E402

from .models import Order  # noqa: E402


@awa_pool.task("send_receipt", max_attempts=5)
def send_receipt(order_id: int) -> dict:
    """Render the receipt (a real shop would e-mail it). The order is there:
    the job committed in the same transaction as the order's row."""
    order = Order.objects.get(pk=order_id)
    return {"order_id": order.pk, "receipt": f"{order.quantity} x {order.item}"}
