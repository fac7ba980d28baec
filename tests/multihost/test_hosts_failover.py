"""Scenario 6 of issue 25: the primary crashes, its synchronous standby is
promoted; supervisors and a producer with one multi-host URL
(target_session_attrs=read-write) follow it without a restart."""
from __future__ import annotations

from pathlib import Path

import pytest

import host_failover

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("hosts")]


@pytest.mark.timeout(240)
def test_supervisors_follow_a_promoted_standby_and_no_committed_job_is_lost(lab_bench, tmp_path: Path) -> None:
    result = host_failover.failover(lab_bench, tmp_path)
    assert result.lost == 0 and result.committed > 100, result
    assert result.leases_run_twice == 0, result
    assert result.supervisors_back_after_s <= 10.0, result
    assert result.first_job_after_s <= 15.0, result
    # only jobs whose claim or outcome was in flight at the crash run again
    assert result.reruns <= 20, result
    assert result.exit_codes == [0, 0], result
