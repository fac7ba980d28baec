"""`python -m awa_pool` runs the CLI."""
from .cli import main

main()
