"""Handlers with retry policies and expiry (tests/test_retry_policy.py,
tests/test_expiry.py). Each records its executions like apps.basic."""
from __future__ import annotations

import awa_pool
from awa_pool import RetryPolicy

from apps.basic import record


def _failing(kind: str, policy: RetryPolicy) -> None:
    @awa_pool.task(kind, max_attempts=3, retry=policy)
    def handler(**_args) -> None:
        record(kind, awa_pool.current_context().id)
        raise RuntimeError(f"{kind} fails every time")


# Delays after attempts 1 and 2: 1 and 1, 1 and 2, 2 and 4, then 1.5 and 1.5 (capped).
_failing("fail_constant", RetryPolicy(backoff="constant", base=1, jitter=0))
_failing("fail_linear", RetryPolicy(backoff="linear", base=1, jitter=0))
_failing("fail_exponential", RetryPolicy(backoff="exponential", base=2, jitter=0))
_failing("fail_capped", RetryPolicy(backoff="exponential", base=3, max_delay=1.5, jitter=0))


@awa_pool.task("give_up", max_attempts=5, retry=RetryPolicy(give_up_on=(ValueError,)))
def give_up() -> None:
    record("give_up", awa_pool.current_context().id)
    raise ValueError("this input will never parse")


@awa_pool.task("only_network", max_attempts=5,
               retry=RetryPolicy(backoff="constant", base=0.2, jitter=0, retry_on=(ConnectionError,)))
def only_network(fail_with: str = "ConnectionError", until: int = 99) -> str:
    ctx = awa_pool.current_context()
    record("only_network", ctx.id)
    if ctx.attempt < until:
        raise {"ConnectionError": ConnectionError, "KeyError": KeyError}[fail_with]("down")
    return f"done at attempt {ctx.attempt}"


@awa_pool.task("retry_wins", max_attempts=3, retry=RetryPolicy(backoff="constant", base=3600))
def retry_wins() -> str:
    ctx = awa_pool.current_context()
    record("retry_wins", ctx.id)
    if ctx.attempt == 1:
        raise awa_pool.Retry(delay=0.2, reason="soon")
    return "second attempt"


@awa_pool.task("soon_stale", queue="stale", expires_in=1)
def soon_stale() -> None:
    record("soon_stale", awa_pool.current_context().id)


@awa_pool.task("fresh", queue="stale")
def fresh() -> None:
    record("fresh", awa_pool.current_context().id)
