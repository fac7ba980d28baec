"""An app whose task declares an impossible retry policy: `start` must stop
at the import with one line, before it touches the database."""
import awa_pool


@awa_pool.task("never", retry=awa_pool.RetryPolicy(backoff="nope"))
def never() -> None:
    pass
