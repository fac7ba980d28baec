"""Operator views: the CLI, top, queue statistics, Prometheus metrics, log setup."""
