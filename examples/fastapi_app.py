"""Transactional enqueue from FastAPI with asyncpg: POST /orders saves the
order and enqueues its receipt in the request's one transaction, so an
order that fails (here: a reference already taken) leaves no job behind,
and the job exists exactly when the order does.

    awa-pool migrate --database-url "$DATABASE_URL"        # once: the queue's schema
    cd examples && DATABASE_URL=postgresql://... uvicorn fastapi_app:app
    cd examples && awa-pool start --app receipts            # runs the receipts

    curl -X POST localhost:8000/orders -H 'content-type: application/json' \\
         -d '{"reference": "A-1", "email": "a@example.com", "item": "book"}'
    curl localhost:8000/orders/1            # the order and its receipt job's state

Every call to awa_pool.aio is awaited on the request's connection: nothing
blocks the event loop, nothing runs in a thread, and awa_pool never
commits (the `async with conn.transaction()` block does).
"""
from __future__ import annotations

import os
from contextlib import asynccontextmanager
from typing import AsyncIterator, Optional

import asyncpg
from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel, Field

from awa_pool import aio
from receipts import send_receipt

CREATE_ORDERS = """
CREATE TABLE IF NOT EXISTS example_orders (
    id          bigserial PRIMARY KEY,
    reference   text NOT NULL UNIQUE,
    email       text NOT NULL,
    item        text NOT NULL,
    receipt_job bigint
)"""


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    database_url = os.environ.get("DATABASE_URL") or os.environ.get("AWA_DATABASE_URL")
    if not database_url:
        raise RuntimeError("set DATABASE_URL to a PostgreSQL URL (migrated with `awa-pool migrate`)")
    app.state.pool = await asyncpg.create_pool(database_url, min_size=1, max_size=5)
    async with app.state.pool.acquire() as conn:
        await conn.execute(CREATE_ORDERS)
    try:
        yield
    finally:
        await app.state.pool.close()


app = FastAPI(title="awa_pool FastAPI example", lifespan=lifespan)


class OrderIn(BaseModel):
    reference: str = Field(min_length=1, max_length=100)
    email: str = Field(min_length=3, max_length=200)
    item: str = Field(min_length=1, max_length=200)


class Receipt(BaseModel):
    job_id: int
    state: str
    result: Optional[dict] = None


@app.post("/orders", status_code=201)
async def create_order(order: OrderIn, request: Request) -> dict:
    async with request.app.state.pool.acquire() as conn:
        try:
            async with conn.transaction():   # the order, its job and the link between them: all or nothing
                order_id = await conn.fetchval(
                    "INSERT INTO example_orders (reference, email, item) VALUES ($1, $2, $3) RETURNING id",
                    order.reference, order.email, order.item)
                job_id = await aio.enqueue(conn, send_receipt.job(order_id=order_id, email=order.email))
                await conn.execute("UPDATE example_orders SET receipt_job = $1 WHERE id = $2", job_id, order_id)
        except asyncpg.UniqueViolationError:
            raise HTTPException(409, f"an order with reference {order.reference!r} exists") from None
    return {"order_id": order_id, "job_id": job_id}


@app.get("/orders/{order_id}")
async def show_order(order_id: int, request: Request) -> dict:
    async with request.app.state.pool.acquire() as conn:
        row = await conn.fetchrow("SELECT id, reference, email, item, receipt_job FROM example_orders "
                                  "WHERE id = $1", order_id)
        if row is None:
            raise HTTPException(404, f"no order {order_id}")
        job = await aio.get_job(conn, row["receipt_job"])
    receipt = Receipt(job_id=job.id, state=job.state.value, result=job.result)
    return {"id": row["id"], "reference": row["reference"], "item": row["item"], "receipt": receipt.model_dump()}


@app.get("/queues")
async def queues(request: Request) -> dict:
    """Live jobs per queue and state, as an autoscaler would poll them."""
    async with request.app.state.pool.acquire() as conn:
        depths = await aio.queue_depth(conn)
    return {name: {"available": d.available, "running": d.running, "scheduled": d.scheduled}
            for name, d in depths.items()}
