"""Serving the dashboard for `awa-pool dashboard`: the exposure rule
(loopback, or a token, or read-only), the base path, and a waitress
server (a production WSGI server, never Flask's development one).
cli.py prints the address and runs it.
"""
from __future__ import annotations

import ipaddress
from typing import Any, Optional

from ..core.errors import ConfigError

LOOPBACK_NAMES = {"localhost", "ip6-localhost", "ip6-loopback"}


def is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, token: Optional[str], read_only: bool) -> None:
    """Refuse to serve the actions to a network without a token."""
    if token is not None and not token.strip():
        raise ConfigError("--token must not be empty")
    if not is_loopback(host) and token is None and not read_only:
        raise ConfigError(f"--host {host} would let anyone who reaches it operate the queue: "
                          "give --token (or AWA_DASHBOARD_TOKEN), or --read-only")


def normalize_base_path(base_path: Optional[str]) -> str:
    """'/awa' from '/awa', 'awa/' or '/awa/'; '' for the root."""
    text = (base_path or "").strip().strip("/")
    if not text:
        return ""
    if any(ch in text for ch in "?#\\ ") or "//" in text or ".." in text.split("/"):
        raise ConfigError(f"--base-path must be a plain URL path like /awa, got {base_path!r}")
    return "/" + text


def make_server(app: Any, host: str, port: int, base_path: str, threads: int) -> Any:
    """A waitress server bound to host:port (port 0 picks a free one); its
    `effective_port` is the port actually bound, `run()` serves."""
    try:
        from waitress import create_server
    except ImportError:
        raise ConfigError("the dashboard needs waitress: pip install 'awa-pool[dashboard]'") from None
    return create_server(app, host=host, port=port, url_prefix=base_path, threads=threads,
                         ident="awa-pool dashboard", clear_untrusted_proxy_headers=True)
