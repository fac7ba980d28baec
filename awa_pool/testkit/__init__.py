"""Test support behind awa_pool.testing and the pytest plugin: test databases
and the enqueued-job assertions."""
