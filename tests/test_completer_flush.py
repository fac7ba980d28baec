"""Completer.flush against a real database: how many statements a flush
costs, and what happens when the database refuses a value in it."""
from __future__ import annotations

from typing import Any, Dict, List

import psycopg2

import awa_pool
from awa_pool import Job
from awa_pool.worker import fetcher
from awa_pool.worker.completer import BackgroundCompleter, Completer
from awa_pool.worker.flush_policy import FlushPolicy
from awa_pool.worker.protocol import Outcome
from helpers import query, wait_for


class CountingCursor:
    """A real cursor that remembers the statements sent through it."""

    def __init__(self, cur: Any) -> None:
        self.cur = cur
        self.statements: List[str] = []

    def execute(self, sql: str, params: Any = None) -> None:
        self.statements.append(sql)
        self.cur.execute(sql, params)

    def fetchall(self) -> list:
        return self.cur.fetchall()

    @property
    def description(self) -> Any:
        return self.cur.description


def running_jobs(auto, count: int) -> Dict[int, int]:
    awa_pool.enqueue_many(auto, [Job("k", queue="flush") for _ in range(count)])
    with auto.cursor() as cur:
        cur.execute("SELECT id, lease FROM awa.claim('flush', %s, 1)", (count,))
        return dict(cur.fetchall())


def states(dsn: str, ids) -> Dict[int, str]:
    return dict(query(dsn, "SELECT id, state::text FROM awa.jobs WHERE id = ANY(%s)", (list(ids),)))


def test_successes_and_failures_in_one_flush_cost_one_statement(auto, dsn) -> None:
    leases = running_jobs(auto, 4)
    done, retried, also_done, failed = leases
    completer = Completer(max_crashes=3)
    completer.add(Outcome(done, leases[done], "completed", result='{"n": 1}'))
    completer.add(Outcome(retried, leases[retried], "retry", error="again", delay_s=60))
    completer.add(Outcome(also_done, leases[also_done], "completed"))
    completer.add(Outcome(failed, leases[failed], "fatal", error="no"))
    with auto.cursor() as raw:
        cur = CountingCursor(raw)
        applied = completer.flush(cur)
    assert len(cur.statements) == 1, cur.statements
    assert sorted(applied) == sorted([(done, "completed"), (also_done, "completed"),
                                      (retried, "retryable"), (failed, "failed")])
    assert states(dsn, leases) == {done: "completed", also_done: "completed", retried: "retryable",
                                   failed: "failed"}
    assert awa_pool.get_job(auto, done).result == {"n": 1}
    assert completer.pending == 0


def test_a_value_the_database_refuses_fails_only_its_own_job(auto, dsn) -> None:
    leases = running_jobs(auto, 3)
    refused, done, retried = leases
    completer = Completer(max_crashes=3)
    # JSON Python would write but jsonb refuses: the whole combined statement fails
    completer.add(Outcome(refused, leases[refused], "completed", result='{"text": "\\u0000"}'))
    completer.add(Outcome(done, leases[done], "completed"))
    completer.add(Outcome(retried, leases[retried], "retry", error="again", delay_s=60))
    with auto.cursor() as cur:
        applied = completer.flush(cur)
    assert sorted(applied) == sorted([(refused, "failed"), (done, "completed"), (retried, "retryable")])
    assert states(dsn, leases) == {refused: "failed", done: "completed", retried: "retryable"}
    assert "the database refused this job's outcome" in awa_pool.get_job(auto, refused).errors[-1]["error"]


def background(dsn: str, gap_s: float) -> BackgroundCompleter:
    """A started BackgroundCompleter that believes outcomes arrive every
    gap_s, with a company window far longer than any test waits."""
    completer = BackgroundCompleter(dsn, max_crashes=3)
    completer.policy.MAX_COALESCE_S = 60.0
    completer.policy.gap_s = gap_s
    completer.start()
    return completer


def test_a_trickle_of_outcomes_is_written_two_at_a_time(auto, dsn) -> None:
    """While jobs still run, a lone outcome waits (up to MAX_COALESCE_S, for
    more) for the next one: one statement for both."""
    leases = running_jobs(auto, 2)
    first, second = leases
    completer = background(dsn, gap_s=20.0)  # a 25 s window
    try:
        completer.add([Outcome(first, leases[first], "completed")], more_coming=True)
        # the last job's outcome: nothing more is coming, so the flush goes at once
        completer.add([Outcome(second, leases[second], "completed")], more_coming=False)
        wait_for(lambda: states(dsn, leases) == {first: "completed", second: "completed"},
                 timeout=10, message="both outcomes written well inside the 25 s window")
        assert completer.flushes == 1
    finally:
        completer.stop()


def test_no_wait_for_company_when_no_job_is_running(auto, dsn) -> None:
    leases = running_jobs(auto, 1)
    (only,) = leases
    completer = background(dsn, gap_s=20.0)
    try:
        completer.add([Outcome(only, leases[only], "completed")], more_coming=False)
        wait_for(lambda: states(dsn, leases) == {only: "completed"}, timeout=10,
                 message="the last outcome written at once, not after a company window")
    finally:
        completer.stop()


def test_big_results_go_in_bounded_statements_and_hold_claiming_back(auto, dsn, monkeypatch) -> None:
    """Results of ~1 MB: a flush writes them in statements of at most
    FLUSH_BYTES (one result at least), and while more than
    PENDING_BYTES_CAP of them wait, over_budget() is true; on_relief() is
    called once they are written."""
    import awa_pool.worker.completer as completer_module
    import awa_pool.worker.outcome_buffer as buffer_module

    monkeypatch.setattr(buffer_module, "FLUSH_BYTES", 2_500_000)
    monkeypatch.setattr(buffer_module, "PENDING_BYTES_CAP", 3_000_000)
    monkeypatch.setattr(completer_module, "PENDING_BYTES_CAP", 3_000_000)
    leases = running_jobs(auto, 5)
    blob = '{"blob": "%s"}' % ("x" * 1_000_000)
    flush = Completer(max_crashes=3)
    for job_id in list(leases)[:3]:
        flush.add(Outcome(job_id, leases[job_id], "completed", result=blob))
    with auto.cursor() as raw:
        cur = CountingCursor(raw)
        flush.flush(cur)
    assert len(cur.statements) == 2  # 2 MB, then 1 MB: never 3 in one statement
    assert awa_pool.get_job(auto, list(leases)[0]).result == {"blob": "x" * 1_000_000}

    relieved = []
    background_completer = BackgroundCompleter(dsn, 3)
    background_completer.on_relief = lambda: relieved.append(True)
    rest = list(leases)[3:]
    background_completer.add([Outcome(j, leases[j], "completed", result=blob + " " * 600_000) for j in rest])
    assert background_completer.over_budget()   # 3.2 MB waiting
    background_completer.start()
    try:
        wait_for(lambda: relieved == [True], timeout=30, message="on_relief after the big results are written")
        assert not background_completer.over_budget()
        assert states(dsn, leases) == dict.fromkeys(leases, "completed")
    finally:
        background_completer.stop()


def company_window(gap_s: float, arrivals: List[float], more_coming: bool = True) -> float:
    """The company window of a buffer whose outcomes arrived at these
    offsets (seconds after the first), at an average gap of gap_s."""
    policy = FlushPolicy()
    policy.arrived(100.0 + arrivals[-1], more_coming)
    policy.gap_s = gap_s
    return policy.window(pending=len(arrivals))


def test_the_company_window_waits_max_coalesce_for_company_and_a_claim() -> None:
    """45 ms jobs on two children (an outcome every 22.5 ms): a small flush
    waits MAX_COALESCE_S from its first outcome, for more and for a refill
    claim to carry them; never when nothing more is coming or outcomes come
    further apart than MAX_COALESCE_S."""
    max_s = FlushPolicy.MAX_COALESCE_S
    assert max_s == 0.05
    assert company_window(0.0225, [0.0]) == max_s
    assert company_window(0.0225, [0.0, 0.0225]) == max_s
    assert company_window(0.0125, [0.0, 0.0125, 0.025, 0.0375]) == max_s
    assert company_window(0.0225, [0.0], more_coming=False) == 0.0
    assert company_window(0.06, [0.0]) == 0.0


def test_plain_successes_ride_on_a_claim_in_its_statement(auto, dsn) -> None:
    """lend() hands the claim the successes without result or progress; the
    claim writes them and claims in one statement; the others stay for the
    completer's flush, and every one of them counts as pending meanwhile."""
    leases = running_jobs(auto, 3)
    plain, with_result, retried = leases
    awa_pool.enqueue_many(auto, [Job("k", queue="next") for _ in range(2)])
    completer = BackgroundCompleter(dsn, max_crashes=3)  # not started: no flush but ours
    completer.add([Outcome(plain, leases[plain], "completed", wall_s=0.05, cpu_s=0.04),
                   Outcome(with_result, leases[with_result], "completed", result='{"n": 1}'),
                   Outcome(retried, leases[retried], "retry", error="again", delay_s=60)],
                  more_coming=True)
    loan = completer.lend()
    assert [o.job_id for o in loan] == [plain]
    assert completer.pending == 3 and completer.pending_ids() == set(leases)
    with auto.cursor() as raw:
        cur = CountingCursor(raw)
        claimed = fetcher.claim(cur, queue="next", limit=2, supervisor_id=1, aging_s=60.0, completing=loan)
    completer.repay(written=True)
    assert len(cur.statements) == 1 and len(claimed) == 2
    assert states(dsn, leases) == {plain: "completed", with_result: "running", retried: "running"}
    assert states(dsn, [job.id for job in claimed]) == dict.fromkeys([job.id for job in claimed], "running")
    assert query(dsn, "SELECT wall_s FROM awa.jobs_done WHERE id = %s", (plain,)) == [(0.05,)]
    assert completer.rides == 1 and completer.pending == 2
    assert completer.lend() == []   # nothing plain is left


def test_a_claim_that_fails_writes_none_of_its_riders_and_gives_them_back(auto, dsn) -> None:
    """The two statements are one transaction: a claim the database refuses
    applies no success either; repay(written=False) puts them back, and the
    completer writes them at once, without waiting for company."""
    leases = running_jobs(auto, 2)
    completer = BackgroundCompleter(dsn, max_crashes=3)
    completer.policy.MAX_COALESCE_S = 60.0
    completer.policy.gap_s = 20.0
    completer.add([Outcome(job_id, lease, "completed") for job_id, lease in leases.items()], more_coming=True)
    loan = completer.lend()
    assert len(loan) == 2
    with auto.cursor() as cur:
        try:
            fetcher.claim(cur, queue="next", limit=1, supervisor_id=1, aging_s=60.0,
                          lane=70000, completing=loan)  # lane is a smallint: refused
        except psycopg2.Error:
            refused = True
        else:
            refused = False
    assert refused
    assert states(dsn, leases) == dict.fromkeys(leases, "running")
    completer.repay(written=False)
    assert completer.pending == 2 and completer.rides == 0
    completer.start()
    try:
        wait_for(lambda: states(dsn, leases) == dict.fromkeys(leases, "completed"), timeout=10,
                 message="the given-back successes written without a 25 s company window")
        assert completer.flushes == 1
    finally:
        completer.stop()


def test_outcomes_added_without_a_wake_up_wait_for_nudge() -> None:
    """The supervisor adds a child's outcomes with wake=False and nudges the
    thread after its claims: woken only if no claim carried them (lend)."""
    completer = BackgroundCompleter("postgresql:///unused", max_crashes=3)  # never started
    completer.add([Outcome(1, 1, "completed")], more_coming=True, wake=False)
    assert not completer.wakeup.is_set()
    assert [o.job_id for o in completer.lend()] == [1]
    completer.nudge()
    assert not completer.wakeup.is_set()     # a claim carries it: nothing to wake for
    completer.repay(written=True)
    completer.add([Outcome(2, 1, "completed", result='{"n": 1}')], more_coming=True, wake=False)
    assert completer.lend() == []            # a result does not ride
    completer.nudge()
    assert completer.wakeup.is_set()
