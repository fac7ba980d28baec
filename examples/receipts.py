"""The task the producer examples enqueue: a receipt for an order.

    cd examples && awa-pool start --app receipts

runs the jobs that fastapi_app.py, node_producer/ and psql_producer.sql
enqueue (the FastAPI app imports it too). A real app would render and send
the e-mail here; this one returns what it would have sent.
"""
from __future__ import annotations

import awa_pool


@awa_pool.task("send_receipt", max_attempts=5)
def send_receipt(order_id: int, email: str) -> dict:
    return {"order_id": order_id, "sent_to": email}
