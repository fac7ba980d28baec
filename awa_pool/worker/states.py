"""A supervisor's states (lifecycle.py moves it through them), apart so
that readers in other threads (the health probes) need not load the
lifecycle and the children's table behind it."""

STARTING, RUNNING, DRAINING, STOPPING, STOPPED = "starting", "running", "draining", "stopping", "stopped"
