"""An app module whose import fails inside it (for the CLI error tests):
the error line must show the ImportError itself, not just "not found"."""
from apps.basic import this_name_does_not_exist  # noqa: F401
