"""What the supervisor knows of a job it handed to a child (InFlight), an
outcome paired with that record (Finished), and what comes back from the
children's table for the supervisor to route (Released, Checked, Reaped).

Children alone creates and updates these; the supervisor and its hooks
(metrics, Pool's on_outcome) only read them, so an outcome's kind, queue
and attempt come from the one record made at hand-out, not from a second
map kept elsewhere.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, NamedTuple, Optional, Set, Tuple

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
    max_attempts: int = 0  # for the failure log lines (failure_log.py)


class Finished(NamedTuple):
    """An outcome and the record of its job (None only for a message about
    a job this supervisor no longer knew of)."""

    outcome: Outcome
    job: Optional[InFlight]


@dataclass
class Released:
    """Jobs handed back unstarted (outcome "released"): the completer puts
    them back in their queues, which the claimer should look at again."""

    outcomes: List[Outcome] = field(default_factory=list)
    queues: Set[str] = field(default_factory=set)

    def extend(self, other: "Released") -> None:
        self.outcomes.extend(other.outcomes)
        self.queues |= other.queues


@dataclass
class Checked:
    """What one deadline check did: children killed for a timeout, jobs
    taken back from behind long runners."""

    timed_out: int = 0
    released: Released = field(default_factory=Released)


@dataclass
class Reaped:
    """A dead child's last word: outcomes it sent before dying plus one for
    each job it still held, its exit code and the death in words."""

    outcomes: List[Finished]
    exitcode: Optional[int]
    cause: str
    expected: bool              # it exited after being asked to stop
    kill_reason: Optional[Tuple[str, str]]
