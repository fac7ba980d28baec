"""Fixtures of the multi-host tests: hosts are network namespaces on a bridge
(tests/netns.py) and PostgreSQL is a private server listening on that bridge
(tests/pgserver.py). One bench per test session (xdist worker); every test
module here puts its tests in the xdist group "hosts", so they run one after
another on one worker and their timings do not compete. Without root, iproute2 or the
PostgreSQL server binaries, every test here skips with one line saying why.
"""
from __future__ import annotations

from typing import Iterator

import pytest

import hostlab

WHY_NOT = hostlab.unavailable()


@pytest.fixture(scope="session")
def bench() -> Iterator[hostlab.Bench]:
    if WHY_NOT:
        pytest.skip(WHY_NOT)
    with hostlab.open_bench() as made:
        yield made


@pytest.fixture
def lab_bench(bench: hostlab.Bench) -> Iterator[hostlab.Bench]:
    """The session's bench, with every host of the test removed afterwards."""
    try:
        yield bench
    finally:
        bench.lab.remove_hosts()
