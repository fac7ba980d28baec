"""Scenario 5 of issue 25: supervisors behind a real PgBouncer, in
transaction mode (with and without a direct session URL) and in session
mode with one URL. Producers, admin calls and wait() go through it too."""
from __future__ import annotations

from pathlib import Path

import pytest

import host_pooler
import pgbouncer

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("hosts"),
              pytest.mark.skipif(pgbouncer.unavailable() is not None, reason=str(pgbouncer.unavailable()))]

EVERY_FEATURE = {"complete": "completed", "retry": "completed", "callback": "completed", "snooze": "completed",
                 "fail": "failed", "scheduled": "completed", "cancel": "cancelled"}
NOTHING_LEFT = {"advisory locks": 0, "async commit sessions": 0, "stray notifications": 0}


@pytest.mark.timeout(240)
def test_transaction_mode_with_a_session_url_does_everything(lab_bench, tmp_path: Path) -> None:
    result = host_pooler.behind_pgbouncer(lab_bench, tmp_path, mode="transaction", session_url=True)
    assert result.states == EVERY_FEATURE, result
    assert result.listening == [True, True] and len(result.leaders) == 1, result
    # each supervisor's liveness lock on two sessions, and the leader lock, on
    # the session URL's direct sessions
    assert result.direct_locks == 5, result
    assert result.cron_ticks >= 2 and result.takeover_s is not None and result.takeover_s <= 3.0, result
    assert result.cancel_seen_s <= 1.0, result          # the cancel's NOTIFY, on the direct session
    assert result.warnings == [0, 0], result
    assert result.leftovers == NOTHING_LEFT, result
    assert result.exit_codes == [0], result


@pytest.mark.timeout(240)
def test_transaction_mode_without_a_session_url_polls_and_never_leads(lab_bench, tmp_path: Path) -> None:
    result = host_pooler.behind_pgbouncer(lab_bench, tmp_path, mode="transaction", session_url=False)
    assert result.states == {name: state for name, state in EVERY_FEATURE.items()
                             if name not in host_pooler.NEED_LEADER}, result
    assert result.listening == [False, False] and result.leaders == [] and result.direct_locks == 0, result
    assert result.cancel_seen_s <= 1.0, result          # found by polling every 0.2 s
    assert result.warnings == [1, 1], result             # one line each, at start
    assert result.leftovers == NOTHING_LEFT, result
    assert result.exit_codes == [0, 0], result


@pytest.mark.timeout(240)
def test_session_mode_works_with_one_url(lab_bench, tmp_path: Path) -> None:
    result = host_pooler.behind_pgbouncer(lab_bench, tmp_path, mode="session", session_url=False)
    assert result.states == EVERY_FEATURE, result
    assert result.listening == [True, True] and len(result.leaders) == 1, result
    assert result.takeover_s is not None and result.takeover_s <= 3.0, result
    assert result.cancel_seen_s <= 1.0 and result.warnings == [0, 0], result
    assert result.leftovers == NOTHING_LEFT, result      # DISCARD ALL freed the locks of the killed one
    assert result.exit_codes == [0], result
