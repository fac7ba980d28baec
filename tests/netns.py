"""Test hosts as Linux network namespaces.

A `Lab` is a bridge in the root namespace with a private /24 that nothing
on the machine uses yet; each `Host` is a namespace joined to the bridge by
a veth pair, with an address of its own. Processes started through
`Host.argv` see only that host's link, so cutting the link (the root-side
end of the veth down) partitions the host the way a pulled cable does: its
TCP sessions stay open on both sides and packets are silently lost.

Every namespace and link made here is named `awh<pid in hex>-...`, so that
`remove_stale()` can delete what a killed test run left behind (its pid is
gone) without touching anything of a live run. Needs root and iproute2;
`unavailable()` says in one line why not.
"""
from __future__ import annotations

import fcntl
import ipaddress
import itertools
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Set

PREFIX = "awh"
# Candidate subnets, tried in order; one is taken only when no address or
# route on the machine overlaps it.
CANDIDATE_NETS = [f"10.213.{n}.0/24" for n in range(256)] + [f"172.31.{n}.0/24" for n in range(200, 256)]
GATEWAY_HOST = 1          # the bridge's own address (servers in the root namespace listen here)
SPARE_ADDRESSES = (2, 3)  # more root-namespace addresses, for a second and third server
FIRST_HOST = 10
_LOCK_PATH = Path(tempfile.gettempdir()) / "awa-netns.lock"
_labs = itertools.count()


def ip(*args: str, check: bool = True, namespace: Optional[str] = None) -> subprocess.CompletedProcess:
    """Run `ip ARGS` (inside `namespace` when given); raise with ip's own
    message when it fails and check is set."""
    argv = ["ip"] + (["-n", namespace] if namespace else []) + list(args)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip() or done.stdout.strip()}")
    return done


def unavailable() -> Optional[str]:
    """Why network-namespace hosts cannot be made here, or None."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network-namespace hosts need root (CI runs as root)"
    if shutil.which("ip") is None:
        return "network-namespace hosts need `ip` from iproute2 (apt-get install iproute2)"
    probe = f"{PREFIX}{os.getpid():x}-probe"
    made = ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    ip("netns", "del", probe, check=False)
    return None


def _owner_alive(name: str) -> bool:
    """Whether the process that made a namespace or link of this name lives."""
    head = name[len(PREFIX):].split("-", 1)[0]
    try:
        pid = int(head, 16)
    except ValueError:
        return True  # not one of ours after all: leave it alone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _our_links() -> List[str]:
    names = []
    for line in ip("-o", "link", "show").stdout.splitlines():
        name = line.split(":", 2)[1].strip().split("@", 1)[0]
        if name.startswith(PREFIX):
            names.append(name)
    return names


def _our_namespaces() -> List[str]:
    return [line.split()[0] for line in ip("netns", "list").stdout.splitlines()
            if line.split() and line.split()[0].startswith(PREFIX)]


def _kill_namespace_processes(namespace: str) -> None:
    """SIGKILL what still runs in a namespace this module made (processes the
    tests started there), so the namespace can go."""
    done = ip("netns", "pids", namespace, check=False)
    for token in done.stdout.split():
        try:
            os.kill(int(token), signal.SIGKILL)
        except (ValueError, ProcessLookupError):
            pass


def remove_stale() -> List[str]:
    """Delete namespaces and links a dead test run left behind; returns their names."""
    removed = []
    for namespace in _our_namespaces():
        if not _owner_alive(namespace):
            _kill_namespace_processes(namespace)
            ip("netns", "del", namespace, check=False)
            removed.append(namespace)
    for link in _our_links():
        if not _owner_alive(link):
            ip("link", "del", link, check=False)
            removed.append(link)
    return removed


def _used_networks() -> List[ipaddress.IPv4Network]:
    used = []
    for line in ip("-4", "-o", "addr", "show").stdout.splitlines():
        fields = line.split()
        if "inet" in fields:
            used.append(ipaddress.ip_interface(fields[fields.index("inet") + 1]).network)
    for line in ip("-4", "route", "show", "table", "all").stdout.splitlines():
        target = line.split()[0] if line.split() else ""
        if target[:1].isdigit():
            used.append(ipaddress.ip_network(target, strict=False))
    return used


class Host:
    """One namespace on the lab's bridge."""

    def __init__(self, lab: "Lab", index: int, name: str) -> None:
        self.lab = lab
        self.name = name
        self.namespace = f"{lab.tag}-{name}"
        self.outer = f"{lab.tag}o{index}"   # root-namespace end, a port of the bridge
        self.inner = f"{lab.tag}i{index}"   # the host's own interface
        self.address = str(lab.network.network_address + FIRST_HOST + index)
        self.cut = False

    def argv(self, argv: Sequence[str]) -> List[str]:
        """`argv` run inside this host."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def partition(self) -> None:
        """Cut the host off: its link goes down on the bridge side. Nothing is
        closed; packets either way are lost until heal()."""
        ip("link", "set", self.outer, "down")
        self.cut = True

    def heal(self) -> None:
        ip("link", "set", self.outer, "up")
        self.cut = False

    def delay(self, seconds: float) -> bool:
        """Delay everything the host sends by `seconds` with tc netem; False
        (and nothing changed) when the kernel has no netem."""
        done = subprocess.run(self.argv(["tc", "qdisc", "add", "dev", self.inner, "root", "netem", "delay",
                                         f"{int(seconds * 1000)}ms"]), capture_output=True, text=True, timeout=30)
        return done.returncode == 0

    def pids(self) -> List[int]:
        return [int(token) for token in ip("netns", "pids", self.namespace, check=False).stdout.split()]


class Lab:
    """A bridge with a private /24 and the hosts on it; close() removes all of it."""

    def __init__(self) -> None:
        remove_stale()
        self.tag = f"{PREFIX}{os.getpid():x}-{next(_labs)}"
        self.bridge = f"{self.tag}b"
        if len(self.bridge) + 3 > 15:
            raise RuntimeError(f"interface names from tag {self.tag!r} would exceed 15 characters")
        self.hosts: Dict[str, Host] = {}
        self._extra: Set[int] = set()
        self._indexes = itertools.count()
        with open(_LOCK_PATH, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # two runs must not pick the same subnet
            self.network = self._free_network()
            ip("link", "add", self.bridge, "type", "bridge")
            try:
                ip("addr", "add", f"{self.address(GATEWAY_HOST)}/{self.network.prefixlen}", "dev", self.bridge)
                ip("link", "set", self.bridge, "up")
            except RuntimeError:
                ip("link", "del", self.bridge, check=False)
                raise
        self.gateway = self.address(GATEWAY_HOST)

    def address(self, host_number: int) -> str:
        return str(self.network.network_address + host_number)

    @staticmethod
    def _free_network() -> ipaddress.IPv4Network:
        used = _used_networks()
        for candidate in map(ipaddress.ip_network, CANDIDATE_NETS):
            if not any(candidate.overlaps(other) for other in used):
                return candidate
        raise RuntimeError("no free private /24 for the test hosts in 10.213.0.0/16 or 172.31.200-255.0")

    def add_address(self, host_number: int) -> str:
        """Give the root namespace one more address on the bridge (for another
        server or a relay); giving it twice is harmless."""
        address = self.address(host_number)
        if host_number != GATEWAY_HOST and host_number not in self._extra:
            ip("addr", "add", f"{address}/{self.network.prefixlen}", "dev", self.bridge)
            self._extra.add(host_number)
        return address

    def add_host(self, name: str) -> Host:
        if name in self.hosts:
            raise ValueError(f"host {name!r} exists")
        host = Host(self, next(self._indexes), name)
        ip("netns", "add", host.namespace)
        try:
            ip("link", "add", host.outer, "type", "veth", "peer", "name", host.inner)
            ip("link", "set", host.inner, "netns", host.namespace)
            ip("link", "set", host.outer, "master", self.bridge)
            ip("link", "set", host.outer, "up")
            ip("addr", "add", f"{host.address}/{self.network.prefixlen}", "dev", host.inner,
               namespace=host.namespace)
            ip("link", "set", host.inner, "up", namespace=host.namespace)
            ip("link", "set", "lo", "up", namespace=host.namespace)
        except RuntimeError:
            self._remove_host(host)
            raise
        self.hosts[name] = host
        return host

    def _remove_host(self, host: Host) -> None:
        _kill_namespace_processes(host.namespace)
        ip("netns", "del", host.namespace, check=False)  # takes the veth pair with it
        ip("link", "del", host.outer, check=False)

    def remove_hosts(self) -> None:
        for host in list(self.hosts.values()):
            self._remove_host(host)
        self.hosts.clear()

    def close(self) -> None:
        self.remove_hosts()
        ip("link", "del", self.bridge, check=False)
