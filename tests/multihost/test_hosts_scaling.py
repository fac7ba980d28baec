"""Scenarios 1 and 4 of issue 25: adding hosts does not cost throughput or
PostgreSQL work per job, and one slow host does not slow the others."""
from __future__ import annotations

from pathlib import Path

import pytest

import host_scenarios

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("hosts")]


@pytest.mark.timeout(240)
def test_more_hosts_drain_one_queue_at_least_as_fast_at_the_same_cost_per_job(lab_bench, tmp_path: Path) -> None:
    series = host_scenarios.drain_series(lab_bench, tmp_path, host_counts=[1, 2, 4], jobs=6000, repeats=3)
    best = {n: max(run.jobs_per_s for run in runs) for n, runs in series.items()}
    report = {n: [(round(r.jobs_per_s), round(r.statements_per_job, 3), round(r.transactions_per_job, 3))
                  for r in runs] for n, runs in series.items()}
    # on 2 cores: within 10 % of one host, or better. The best of three
    # interleaved runs of each host count against one host's median: the
    # machine's other work (in CI, the other test worker) only ever slows a
    # run down, and one host's runs spread by 20 % in CI.
    one_host = host_scenarios.median_rate(series[1])
    assert best[2] >= 0.9 * one_host, report
    assert best[4] >= 0.9 * one_host, report
    # PostgreSQL work per job stays small whatever the number of hosts: claims
    # and completions are batched, so well under one statement per job
    for runs in series.values():
        for run in runs:
            assert 0 < run.statements_per_job <= 0.1, report
            assert 0 < run.transactions_per_job <= 0.15, report


@pytest.mark.timeout(240)
def test_a_host_200ms_away_claims_correctly_and_does_not_slow_the_others(lab_bench, tmp_path: Path) -> None:
    result = host_scenarios.latency(lab_bench, tmp_path, rounds=3)
    assert result.round_trip_ms >= 200, result
    assert result.slow_host_jobs >= 1, result
    assert result.reruns == 0 and result.leases_run_twice == 0 and result.not_completed == 0, result
    assert result.ratio >= 0.85, result
    assert result.exit_codes == [0] * 5, result
