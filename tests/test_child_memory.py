"""The child's memory gauge: /proc files kept open, and never written once
a handler has closed them and reused their descriptor numbers."""
from __future__ import annotations

import os

from awa_pool.child import MemoryGauge


def test_peak_follows_a_reset_and_rss_is_reported() -> None:
    gauge = MemoryGauge()
    gauge.reset_peak()
    before, rss = gauge.read()
    block = bytearray(30 * 1024 * 1024)
    block[::4096] = b"x" * len(block[::4096])
    grown, _ = gauge.read()
    del block
    gauge.reset_peak()
    after, _ = gauge.read()
    assert rss and before and grown and after
    assert grown > before + 25 * 1024 * 1024
    assert after < grown - 20 * 1024 * 1024


def test_a_descriptor_reused_by_a_handler_is_not_written(tmp_path) -> None:
    gauge = MemoryGauge()
    gauge.reset_peak()
    gauge.read()
    clear_refs_fd = gauge.clear_refs.fd
    os.close(gauge.status.fd)
    os.close(clear_refs_fd)
    # A handler's own file gets the freed number back.
    mine = tmp_path / "handler-file"
    fd = os.open(mine, os.O_RDWR | os.O_CREAT)
    try:
        assert fd in (clear_refs_fd, gauge.status.fd)
        gauge.reset_peak()
        peak, rss = gauge.read()
        assert peak and rss
        assert mine.read_bytes() == b""  # nothing written into the handler's file
        assert gauge.clear_refs.fd != fd and gauge.status.fd != fd
    finally:
        os.close(fd)
