"""`python -m awa_pool` runs the CLI."""
from .ops.cli import main

main()
