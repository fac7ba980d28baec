"""Scenarios 2 and 3 of issue 25: a host's link is cut (the bridge side of its
veth goes down: packets are lost, no connection is closed) and healed."""
from __future__ import annotations

from pathlib import Path

import pytest

import host_scenarios

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("hosts")]


@pytest.mark.timeout(150)
def test_a_cut_off_worker_host_is_rescued_and_rejoins(lab_bench, tmp_path: Path) -> None:
    result = host_scenarios.partition_worker(lab_bench, tmp_path)
    # rescued once silent for the heartbeat staleness (10 s), by the rescue
    # that runs every second; never earlier, though the server still holds
    # the cut host's sessions
    assert 10.0 <= result.silent_for_s <= 13.0, result
    assert result.rescued_after_s <= 13.0, result
    # its session is still held by the server, so its liveness lock too: the
    # fast path (a free lock) must not fire, only the heartbeat staleness
    assert all("no heartbeat" in reason for reason in result.rescue_reasons), result
    assert result.completed_elsewhere >= 1, result
    # the cut host's children finished their attempts; the lease guard dropped those outcomes
    assert result.late_executions >= 1, result
    assert result.kept_from_cut_host == 0, result
    assert result.leases_run_twice == 0 and result.not_completed == 0, result
    # the same process is back within seconds of the heal and takes work again
    assert result.rejoined_after_s <= 15.0, result
    assert result.ran_after_rejoin >= 1, result
    assert result.exit_codes == [0, 0], result


@pytest.mark.timeout(150)
def test_a_cut_off_leader_is_replaced_and_cron_fires_once_per_tick(lab_bench, tmp_path: Path) -> None:
    result = host_scenarios.partition_leader(lab_bench, tmp_path)
    assert result.took_over_after_s <= 15.0, result
    assert result.duplicate_ticks == 0 and result.missing_ticks == 0, result
    assert result.ticks >= 10, result
    assert result.rejoined_after_s <= 15.0, result
    assert len(result.leaders_at_end) == 1, result
    assert result.exit_codes == [0, 0], result


@pytest.mark.timeout(200)
def test_a_cut_off_host_notices_on_its_own_and_heeds_sigterm(lab_bench, tmp_path: Path) -> None:
    result = host_scenarios.partition_then_stop(lab_bench, tmp_path)
    # a query in flight fails after tcp_user_timeout (10 s), an idle
    # connection after its keepalives (5 s + 3 x 2 s)
    assert result.noticed_after_s <= 16.0, result
    # running jobs get the 30 s shutdown timeout; outcomes it cannot record
    # are given up after 10 s (the leader rescues those jobs)
    assert result.exit_code == 0 and result.exited_after_s <= 60.0, result
    assert result.not_completed == 0, result
