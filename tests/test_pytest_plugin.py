"""The pytest plugin as a user meets it: pytester writes a task module and
test files that use the fixtures, and runs pytest on them in a subprocess
(a fresh task registry each time, the plugin loaded through its pytest11
entry point, the server from the same environment as this suite)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from helpers import query

pytest_plugins = ["pytester"]

SHOP_TASKS = '''
    import awa_pool

    @awa_pool.task("send_receipt", queue="mail")
    def send_receipt(order_id: int) -> dict:
        return {"sent": order_id}

    @awa_pool.task("render_page")
    def render_page(page: int) -> int:
        return page * page

    @awa_pool.task("merge_pages", pass_context=True)
    def merge_pages(ctx) -> int:
        return sum(record.result for record in ctx.batch_results())

    @awa_pool.task("flaky", pass_context=True)
    def flaky(ctx) -> str:
        if ctx.attempt == 1:
            raise awa_pool.Retry(delay=0)      # due again at once
        return "ok"

    @awa_pool.task("broken")
    def broken() -> None:
        raise ValueError("the printer is on fire")
'''


def run_inner(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=300)


@pytest.mark.embedded_smoke
def test_a_test_file_using_the_fixtures_passes(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(shop_tasks=textwrap.dedent(SHOP_TASKS))
    pytester.makepyfile(test_shop='''
        import awa_pool
        import psycopg2
        import shop_tasks

        def test_enqueue_then_run(awa_conn, awa_enqueued, awa_run_jobs):
            job_id = shop_tasks.send_receipt.enqueue(awa_conn, order_id=42)
            record = awa_enqueued.assert_enqueued("send_receipt", {"order_id": 42}, queue="mail")
            assert record.id == job_id and record.state == "available"
            awa_enqueued.assert_not_enqueued("send_receipt", {"order_id": 43})
            [run] = awa_run_jobs()
            assert (run.id, run.kind, run.state, run.result) == (job_id, "send_receipt", "completed", {"sent": 42})
            awa_enqueued.assert_enqueued("send_receipt", state="completed", result={"sent": 42})

        def test_batch_follow_up_retries_and_failures(awa_conn, awa_run_jobs):
            batch = awa_pool.enqueue_batch(awa_conn, [shop_tasks.render_page.job(page=p) for p in range(4)],
                                           then=shop_tasks.merge_pages.job())
            shop_tasks.flaky.enqueue(awa_conn)
            shop_tasks.broken.enqueue(awa_conn)
            runs = awa_run_jobs()
            # claim order (priority, run_at, id): the follow-up, released when the
            # last page completed, has a lower id than `flaky`
            assert [(run.kind, run.attempt, run.state) for run in runs] == [
                ("render_page", 1, "completed"), ("render_page", 1, "completed"),
                ("render_page", 1, "completed"), ("render_page", 1, "completed"),
                ("merge_pages", 1, "completed"),
                ("flaky", 1, "available"), ("flaky", 2, "completed"),
                ("broken", 1, "retryable")]
            assert runs[4].id == batch.then_id and runs[4].result == 0 + 1 + 4 + 9
            assert runs[7].error == "ValueError: the printer is on fire"
            assert awa_run_jobs() == []            # the backoff of `broken` is not over

        def test_each_test_starts_from_an_empty_migrated_database(awa_database, awa_conn, awa_enqueued):
            assert awa_enqueued.jobs() == []
            with awa_conn.cursor() as cur:
                cur.execute("SELECT current_database()")
                assert cur.fetchone()[0] in awa_database
            other = psycopg2.connect(awa_database)    # committed elsewhere: seen too
            shop_tasks.render_page.enqueue(other, page=3)
            other.commit()
            other.close()
            awa_enqueued.assert_enqueued("render_page", {"page": 3})

        def test_a_rollback_means_no_job(awa_conn, awa_enqueued):
            shop_tasks.send_receipt.enqueue(awa_conn, order_id=7)
            awa_conn.rollback()
            awa_enqueued.assert_not_enqueued("send_receipt")
    ''')
    result = run_inner(pytester)
    result.assert_outcomes(passed=4)


def test_a_missing_enqueue_fails_with_a_readable_message(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(shop_tasks=textwrap.dedent(SHOP_TASKS))
    pytester.makepyfile(test_missing='''
        import shop_tasks

        def test_wrong_order(awa_conn, awa_enqueued):
            shop_tasks.send_receipt.enqueue(awa_conn, order_id=42)
            shop_tasks.render_page.enqueue(awa_conn, page=1)
            awa_enqueued.assert_enqueued("send_receipt", {"order_id": 43})

        def test_nothing_enqueued(awa_enqueued):
            awa_enqueued.assert_enqueued("send_receipt", args_include={"order_id": 43})

        def test_unexpected_job(awa_conn, awa_enqueued):
            shop_tasks.send_receipt.enqueue(awa_conn, order_id=42)
            awa_enqueued.assert_not_enqueued("send_receipt", queue="mail")
    ''')
    result = run_inner(pytester)
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines([
        "E       AssertionError: expected a job of kind 'send_receipt' with args {'order_id': 43}, "
        "found none; enqueued instead (2):",
        "E         #1 send_receipt args={'order_id': 42} queue='mail' state='available'",
        "E         #2 render_page args={'page': 1} queue='default' state='available'",
    ])
    result.stdout.fnmatch_lines([
        "E       AssertionError: expected a job of kind 'send_receipt' with args including "
        "{'order_id': 43}, found none: no job was enqueued at all",
    ])
    result.stdout.fnmatch_lines([
        "E       AssertionError: expected no job of kind 'send_receipt' queue='mail', found 1:",
        "E         #1 send_receipt args={'order_id': 42} queue='mail' state='available'",
    ])
    # the failure points at the test's line, not at the plugin's code
    assert "awa_pool/enqueued.py" not in result.stdout.str()


def test_xdist_workers_get_databases_of_their_own(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                                  server_url: str) -> None:
    pytester.makepyfile(test_names='''
        import os
        import pytest

        @pytest.mark.parametrize("n", range(6))
        def test_record_my_database(awa_conn, n):
            with awa_conn.cursor() as cur:
                cur.execute("SELECT current_database()")
                name = cur.fetchone()[0]
            with open(os.path.join(os.environ["NAMES_DIR"], f"{n}.txt"), "w") as out:
                out.write(os.environ["PYTEST_XDIST_WORKER"] + " " + name)
    ''')
    names_dir = pytester.mkdir("names")
    monkeypatch.setenv("NAMES_DIR", str(names_dir))
    result = run_inner(pytester, "-n", "2")
    result.assert_outcomes(passed=6)
    recorded = [path.read_text().split() for path in names_dir.iterdir()]
    names = [name for _, name in recorded]
    assert len(recorded) == 6 and len(set(names)) == 6, recorded
    for worker, name in recorded:
        assert name.startswith(f"awa_t_{worker}_"), (worker, name)
    assert {worker for worker, _ in recorded} == {"gw0", "gw1"}
    left = query(server_url, "SELECT datname FROM pg_database WHERE datname = ANY(%s)", (names,))
    assert left == [], f"test databases left behind after the session: {left}"


def test_the_app_setting_registers_the_users_tasks(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(myapp_tasks='''
        import awa_pool

        @awa_pool.task("shout", queue="loud")
        def shout(text: str) -> str:
            return text.upper()
    ''')
    pytester.makeini("[pytest]\nawa_app = myapp_tasks\n")
    pytester.makepyfile(test_by_kind='''
        import awa_pool

        def test_a_job_enqueued_by_kind_runs_its_handler(awa_conn, awa_run_jobs):
            awa_pool.enqueue(awa_conn, awa_pool.Job("shout", {"text": "hi"}, queue="loud"))
            awa_pool.enqueue(awa_conn, awa_pool.Job("whisper", {"text": "hi"}))
            runs = {run.kind: run for run in awa_run_jobs()}
            assert runs["shout"].state == "completed" and runs["shout"].result == "HI"
            assert runs["whisper"].state == "retryable"
            assert "no handler is registered for kind 'whisper'" in runs["whisper"].error
    ''')
    run_inner(pytester).assert_outcomes(passed=1)
    broken = run_inner(pytester, "--awa-app", "no_such_app_module")
    broken.assert_outcomes(failed=1)
    broken.stdout.fnmatch_lines(["*awa_app: app module 'no_such_app_module' not found (is it on PYTHONPATH?)"])


def test_a_bad_server_url_is_one_clear_line(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_url='''
        def test_needs_a_database(awa_database):
            pass
    ''')
    result = run_inner(pytester, "--awa-database-url", "mysql://root@localhost/app")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*unsupported database URL scheme 'mysql'*"])
    assert "Traceback" not in result.stdout.str()


def test_importing_awa_pool_does_not_import_pytest() -> None:
    script = "import sys, awa_pool, awa_pool.testing; print('pytest' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr
