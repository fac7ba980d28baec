"""The dashboard's defences: security headers, CSRF, read-only mode, the
access token (Bearer and login cookie), escaping of hostile job data, no
connection string on any page, 503 while the database is away and recovery
after, and the command's refusal to expose actions to a network."""
from __future__ import annotations

import subprocess
import sys
import urllib.error
import urllib.request
from urllib.parse import urlsplit

import psycopg2
import psycopg2.extensions
import pytest

import awa_pool
from awa_pool.dashboard import create_app
from awa_pool.dashboard.auth import CSRF_FIELD, SESSION_COOKIE
from cli_run import assert_one_error_line, cli, url_with_password
from dashboard_helpers import TcpProxy, csrf_of, enqueue, failed_job, post, start_dashboard, text
from helpers import query, scalar, wait_for, with_database

PAGES = ["/", "/fragment/overview", "/jobs", "/kinds", "/cron", "/dlq"]
XSS_SCRIPT = "<script>alert('xss')</script>"
XSS_ATTR = '"><img src=x onerror=alert(1)>'


@pytest.fixture
def client(dsn):
    return create_app(dsn).test_client()


def test_every_response_carries_the_security_headers(dsn, client):
    (job_id,) = enqueue(dsn, awa_pool.Job("noop"))
    for path in PAGES + [f"/jobs/{job_id}", "/jobs/99999", "/jobs?state=x", "/static/dash.css"]:
        headers = client.get(path).headers
        csp = headers["Content-Security-Policy"]
        assert "script-src 'self'" in csp and "'unsafe-inline'" not in csp and "frame-ancestors 'none'" in csp
        assert headers["X-Frame-Options"] == "DENY"
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert headers["Referrer-Policy"] == "same-origin"


def test_pages_have_no_inline_script_or_style(dsn, client):
    failed_job(dsn)
    for path in PAGES + ["/jobs/1"]:
        html = text(client.get(path))
        assert "<script>" not in html and " style=" not in html and "onclick" not in html.lower()
        assert "<script src=" in html or path.startswith("/fragment")


def test_a_post_without_or_with_a_wrong_csrf_token_is_refused_and_changes_nothing(dsn, client):
    job_id = failed_job(dsn)
    csrf_of(client)
    assert client.post(f"/jobs/{job_id}/retry").status_code == 403
    assert client.post(f"/jobs/{job_id}/retry", data={CSRF_FIELD: "forged"}).status_code == 403
    other = create_app(dsn).test_client()      # another browser's token
    assert client.post(f"/jobs/{job_id}/retry", data={CSRF_FIELD: csrf_of(other)}).status_code == 403
    cross = post(client, f"/jobs/{job_id}/retry", headers={"Origin": "http://evil.example"})
    assert cross.status_code == 403 and "CSRF" in text(cross)
    assert scalar(dsn, "SELECT state::text FROM awa.jobs WHERE id = %s", (job_id,)) == "failed"
    assert post(client, f"/jobs/{job_id}/retry").status_code == 302   # the real token works


def test_read_only_shows_no_action_and_refuses_every_post(dsn):
    job_id = failed_job(dsn)
    query(dsn, "INSERT INTO awa.queues (name, dlq) VALUES ('default', true) ON CONFLICT (name) DO NOTHING")
    client = create_app(dsn, read_only=True).test_client()
    for path in PAGES + [f"/jobs/{job_id}", "/jobs?queue=default"]:
        html = text(client.get(path))
        assert 'method="post"' not in html and "Cancel matching" not in html and "Retry now" not in html
    assert "read-only" in text(client.get("/"))
    for path, form in [(f"/jobs/{job_id}/retry", {}), (f"/jobs/{job_id}/cancel", {}),
                       ("/queues/pause", {"queue": "default"}), ("/dlq/purge", {"all": "1"}),
                       ("/cron/trigger", {"name": "x"}), ("/jobs/cancel", {"queue": "default", "max_id": "9"})]:
        refused = client.post(path, data=form)     # no form of its own to take a CSRF token from
        assert refused.status_code == 403 and "read-only" in text(refused)
    assert scalar(dsn, "SELECT state::text FROM awa.jobs WHERE id = %s", (job_id,)) == "failed"
    assert scalar(dsn, "SELECT paused FROM awa.queues WHERE name = 'default'") is False


def test_with_a_token_every_request_needs_it(dsn):
    token = "s3cret-token-for-the-test"
    client = create_app(dsn, token=token).test_client()
    login = client.get("/jobs?state=failed")
    assert login.status_code == 302 and "/login?next=" in login.headers["Location"]
    assert client.get("/fragment/overview").status_code == 401
    assert client.get("/", headers={"Authorization": "Bearer wrong"}).status_code == 302
    assert client.get("/", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    assert client.get("/static/dash.css").status_code == 200     # the login page needs its stylesheet

    form = text(client.get("/login?next=/jobs?state=failed"))
    assert 'type="password"' in form
    wrong = post(client, "/login", {"token": "nope", "next": "/jobs"})
    assert wrong.status_code == 401 and "not right" in text(wrong)
    signed_in = post(client, "/login", {"token": token, "next": "/jobs?state=failed"})
    assert signed_in.status_code == 302 and signed_in.headers["Location"] == "/jobs?state=failed"
    cookie = next(h for h in signed_in.headers.getlist("Set-Cookie") if h.startswith(SESSION_COOKIE))
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and token not in cookie
    assert client.get("/jobs").status_code == 200 and client.get("/fragment/overview").status_code == 200
    elsewhere = post(client, "/login", {"token": token, "next": "//evil.example/x"})
    assert elsewhere.headers["Location"] == "/"


def test_hostile_job_data_is_shown_escaped(dsn, client):
    (job_id,) = enqueue(dsn, awa_pool.Job("noop", {"html": XSS_SCRIPT, "attr": XSS_ATTR},
                                          tags=[XSS_ATTR], metadata={"note": XSS_SCRIPT}))
    for path in [f"/jobs/{job_id}", "/jobs", f"/jobs?tag={XSS_ATTR}"]:
        html = text(client.get(path))
        assert "<script>alert" not in html and "<img src=x" not in html
        assert "&lt;script&gt;alert" in html or "&lt;img src=x onerror=alert(1)&gt;" in html
    bad = text(client.get("/jobs", query_string={"state": XSS_SCRIPT}))
    assert "<script>alert" not in bad and "&lt;script&gt;" in bad


def test_no_page_or_error_shows_the_connection_string(dsn):
    url, password = url_with_password(dsn)
    client = create_app(url).test_client()
    failed_job(dsn)
    pages = [client.get(p) for p in PAGES + ["/jobs/1", "/jobs/404", "/jobs?state=x"]]
    down = create_app(with_database(url, "awa_no_such_database")).test_client().get("/")
    for response in pages + [down]:
        body = text(response)
        assert password not in body and urlsplit(url).netloc not in body
        assert "postgresql://" not in body and "awa_no_such_database" not in body
    assert down.status_code == 503


def test_database_away_gives_503_and_the_dashboard_recovers_by_itself(dsn):
    server = psycopg2.extensions.parse_dsn(dsn)  # the embedded server's host is a socket directory
    proxy = TcpProxy(server.get("host", "127.0.0.1"), int(server.get("port", 5432))).start()
    try:
        proxied = psycopg2.extensions.make_dsn(dsn, host="127.0.0.1", port=proxy.port)
        client = create_app(proxied).test_client()
        assert client.get("/").status_code == 200
        proxy.stop()
        down = client.get("/jobs")
        assert down.status_code == 503 and "cannot reach its database" in text(down)
        assert '<meta http-equiv="refresh"' in text(down)
        assert client.get("/fragment/overview").status_code == 503
        proxy.start()   # the same port again
        assert client.get("/jobs").status_code == 200
    finally:
        proxy.stop()


def test_a_kept_connection_killed_by_the_server_is_replaced_without_an_error(dsn, client):
    assert client.get("/").status_code == 200
    killed = query(dsn, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                        "AND application_name LIKE 'awa-pool%%'")
    assert killed, "the dashboard kept no connection"
    assert client.get("/").status_code == 200


def test_importing_awa_pool_does_not_import_flask():
    code = "import sys, awa_pool; print('flask' in sys.modules, 'awa_pool.dashboard' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.1", "::"])
def test_the_command_refuses_a_network_address_without_token_or_read_only(dsn, host):
    result = cli("dashboard", "--host", host, "--port", "0", "--database-url", dsn)
    assert_one_error_line(result, f"--host {host}", "--token", "--read-only")


def test_the_command_refuses_an_empty_token_and_a_bad_base_path(dsn):
    assert_one_error_line(cli("dashboard", "--token", " ", "--database-url", dsn), "--token must not be empty")
    assert_one_error_line(cli("dashboard", "--base-path", "/a b", "--database-url", dsn), "--base-path")
    assert_one_error_line(cli("dashboard", "--database-url", "postgresql://postgres@127.0.0.1:1/x"),
                          "cannot connect")


def _get(url: str, headers: dict = None) -> tuple:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), dict(exc.headers)


def test_the_command_serves_with_waitress_under_a_base_path_and_a_token(dsn, processes):
    failed_job(dsn)
    base = start_dashboard(processes, dsn, "--base-path", "/awa/", "--read-only",
                           env={"AWA_DASHBOARD_TOKEN": "tok-123"})
    assert base.endswith("/awa")
    status, body, headers = _get(base + "/jobs", {"Authorization": "Bearer tok-123"})
    assert status == 200 and 'href="/awa/jobs/1"' in body and 'href="/awa/static/dash.css"' in body
    assert headers["Server"] == "awa-pool dashboard" and headers["X-Frame-Options"] == "DENY"
    assert _get(base + "/static/dash.js")[0] == 200
    status, _, _ = _get(base + "/fragment/overview")
    assert status == 401


def test_the_command_on_a_network_address_with_a_token(dsn, processes):
    base = start_dashboard(processes, dsn, "--host", "0.0.0.0", "--token", "tok-456")
    port = urlsplit(base).port
    wait_for(lambda: _get(f"http://127.0.0.1:{port}/fragment/overview")[0] == 401, timeout=10,
             message="the dashboard answering 401 without its token")
    assert _get(f"http://127.0.0.1:{port}/", {"Authorization": "Bearer tok-456"})[0] == 200
