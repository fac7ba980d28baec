"""A minimal Django shop: placing an order saves it, reserves stock and
enqueues its receipt job in one atomic() block (see views.py)."""
