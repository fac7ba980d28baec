"""What the supervisor knows of a job it handed to a child (InFlight), and
an outcome paired with that record (Finished).

Children alone creates and updates these; the supervisor and its hooks
(metrics, Pool's on_outcome) only read them, so an outcome's kind, queue
and attempt come from the one record made at hand-out, not from a second
map kept elsewhere.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional

from .protocol import ClaimedJob, Outcome


@dataclass
class InFlight:
    """A job handed to a child and not yet reported back."""

    id: int
    lease: int
    kind: str
    queue: str
    timeout_s: Optional[float]
    position: int  # in the child's stream of jobs (see StatusBlock.take_back)
    attempt: int
    # The job as sent, kept while it waits in the child so a more urgent job
    # can overtake it (Children.assign sends it again); None for a big one.
    claimed: Optional[ClaimedJob] = None


class Finished(NamedTuple):
    """An outcome and the record of its job (None only for a message about
    a job this supervisor no longer knew of)."""

    outcome: Outcome
    job: Optional[InFlight]
