"""The multi-host bench itself: hosts reach the private server over the
bridge, a cut link loses packets until healed, and nothing is left behind
(not even by a run that was killed)."""
from __future__ import annotations

import os
import subprocess
import sys

import psycopg2
import pytest

from awa_pool.worker import pooling
from awa_pool.core.db import connect

import netns
import pgbouncer
from hostlab import wait_until

pytestmark = [pytest.mark.xdist_group("hosts")]

CONNECT = ("import psycopg2, sys\n"
           "conn = psycopg2.connect(sys.argv[1], connect_timeout=2)\n"
           "cur = conn.cursor(); cur.execute('SELECT host(inet_client_addr())'); print(cur.fetchone()[0])\n")


def _connect_from(host: netns.Host, url: str) -> subprocess.CompletedProcess:
    return subprocess.run(host.argv([sys.executable, "-c", CONNECT, url]), capture_output=True, text=True,
                          timeout=30)


def test_a_direct_connection_is_told_apart_from_a_pooler(lab_bench) -> None:
    url = lab_bench.server.url(host=lab_bench.server_address)
    conn = connect(url, autocommit=True)
    try:
        assert pooling.classify(conn, url) == pooling.DIRECT
    finally:
        conn.close()


def test_a_host_reaches_the_server_from_its_own_address_until_cut_off(lab_bench) -> None:
    host = lab_bench.lab.add_host("probe")
    url = lab_bench.server.url(host=lab_bench.server_address)
    reached = _connect_from(host, url)
    assert reached.returncode == 0 and reached.stdout.strip() == host.address, reached
    host.partition()
    cut = _connect_from(host, url)
    assert cut.returncode != 0 and "timeout" in cut.stderr.lower(), cut
    host.heal()
    # a connection attempt queued behind an address resolution that failed
    # while the link was down may fail once more ("No route to host")
    wait_until(lambda: _connect_from(host, url).returncode == 0, 15, "the healed host to reach the server",
               interval=0.2)


def test_closing_a_lab_removes_its_hosts_and_what_runs_in_them() -> None:
    if netns.unavailable():
        pytest.skip(netns.unavailable())
    lab = netns.Lab()
    try:
        host = lab.add_host("x")
        sleeper = subprocess.Popen(host.argv(["sleep", "300"]))
        # `ip netns exec` enters the namespace, then runs the command: close
        # only what is in it (a process still on its way in is not yet the lab's)
        wait_until(lambda: sleeper.pid in host.pids(), 10, "the sleeper to enter its namespace")
    finally:
        lab.close()
    assert sleeper.wait(timeout=10) != 0
    assert not [name for name in netns._our_namespaces() + netns._our_links() if name.startswith(lab.tag)]


def test_leftovers_of_a_dead_run_are_removed_and_a_live_runs_are_not() -> None:
    if netns.unavailable():
        pytest.skip(netns.unavailable())
    gone = subprocess.Popen(["true"])
    gone.wait()
    stale = f"{netns.PREFIX}{gone.pid:x}-9"
    live = f"{netns.PREFIX}{os.getpid():x}-9"
    netns.ip("netns", "add", f"{stale}-h")
    netns.ip("link", "add", f"{stale}b", "type", "bridge")
    netns.ip("link", "add", f"{live}b", "type", "bridge")
    try:
        removed = netns.remove_stale()
        assert f"{stale}-h" in removed and f"{stale}b" in removed
        assert f"{live}b" in netns._our_links() and f"{stale}b" not in netns._our_links()
        assert f"{stale}-h" not in netns._our_namespaces()
    finally:
        netns.ip("link", "del", f"{live}b", check=False)
        netns.ip("link", "del", f"{stale}b", check=False)
        netns.ip("netns", "del", f"{stale}-h", check=False)


@pytest.mark.parametrize("mode", ["transaction", "session"])
def test_a_private_pgbouncer_relays_a_host_to_the_server(lab_bench, mode: str) -> None:
    if pgbouncer.unavailable():
        pytest.skip(pgbouncer.unavailable())
    bouncer = pgbouncer.PgBouncer(lab_bench.server_address, lab_bench.server_address, lab_bench.server.port, mode)
    try:
        host = lab_bench.lab.add_host("client")
        reached = _connect_from(host, bouncer.url("postgres"))
        assert reached.returncode == 0 and reached.stdout.strip() == lab_bench.server_address, reached
        conn = connect(bouncer.url("postgres"), autocommit=True)
        try:
            assert pooling.classify(conn, bouncer.url("postgres")) == {
                "transaction": pooling.TRANSACTION_POOLER, "session": pooling.SESSION_POOLER}[mode]
        finally:
            conn.close()
        admin = psycopg2.connect(bouncer.url("pgbouncer"))
        admin.autocommit = True
        with admin.cursor() as cur:
            cur.execute("SHOW CONFIG")
            config = {row[0]: row[1] for row in cur.fetchall()}
        admin.close()
        assert config["pool_mode"] == mode
    finally:
        bouncer.stop()
    assert not bouncer.root.exists()
