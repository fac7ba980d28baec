"""Operations as plans: the statements an operation sends and what it makes
of their rows, with no I/O, so the synchronous and the asyncio seams send
exactly the same SQL with exactly the same parameters.

A plan is built by the operation (producer.enqueue_plan, admin.get_job_plan,
...) after it validated its input, so bad input fails before a connection
is even looked at. Its `steps` is a generator that yields a `Query` (a name
of schema/queries/*.sql and its `%(name)s` parameters), is sent back the
`Rows` the database answered, and finally returns the operation's result.
`drivers.Link.run` drives it on a psycopg2 or psycopg 3 cursor,
`aio_drivers.AsyncLink.run` awaits each query on psycopg 3 async or asyncpg
(which converts the parameters to its own `$n` style once, in its seam).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Generator, Generic, List, Mapping, Optional, Sequence, \
    Tuple, TypeVar

T = TypeVar("T")
Loads = Callable[[Any], Any]


@dataclass(frozen=True)
class Query:
    """One statement to run: a key of QUERIES and its parameters."""

    name: str
    params: Mapping[str, Any]


@dataclass(frozen=True)
class Rows:
    """What a statement returned: its rows (indexable by position) and the
    names of its columns (empty when it returned none)."""

    values: Sequence[Any]
    names: Tuple[str, ...] = ()

    def dicts(self) -> List[dict]:
        return [dict(zip(self.names, row)) for row in self.values]


Steps = Generator[Query, Rows, T]


@dataclass(frozen=True)
class Plan(Generic[T]):
    """An operation ready to run on any seam.

    `loads` decodes the json/jsonb columns of its rows (None: it reads
    none, so no decoder is set up); `writes` says it inserts jobs, which
    asyncpg may only do inside the caller's transaction (see aio_drivers).
    """

    steps: Steps[T]
    loads: Optional[Loads] = json.loads
    writes: bool = False


def drive(steps: Steps[T], execute: Callable[[Query], Rows]) -> T:
    """Run a plan's steps with a blocking `execute`."""
    try:
        query = next(steps)
        while True:
            query = steps.send(execute(query))
    except StopIteration as done:
        return done.value


async def drive_async(steps: Steps[T], execute: Callable[[Query], Awaitable[Rows]]) -> T:
    """Run a plan's steps, awaiting each query."""
    try:
        query = next(steps)
        while True:
            rows = await execute(query)
            query = steps.send(rows)
    except StopIteration as done:
        return done.value
