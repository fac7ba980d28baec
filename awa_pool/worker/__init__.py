"""The worker core behind the supervisor: the pipe protocol and what a child runs,
the children's table, claiming and placement, outcome writing, the database
sessions, leadership and maintenance, shutdown; and Pool, which starts it."""
