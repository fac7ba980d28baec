"""The Python API a producer calls in its own transaction (enqueue, wait, admin,
cron admin, migrate, grants) and the one seam for a caller's connection (drivers)."""
