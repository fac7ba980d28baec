"""One owner of scheduling state (SPEC §7): the loop's thread alone writes
the children's table, the claimer, the job times and the weighted turns;
the completer, leader and watchdog threads only exchange messages with it.

With AWA_POOL_CHECK_OWNER=1 in the environment (the test suite sets it),
an attribute write to one of those objects from any thread but the one
that started the loop is logged, recorded in `violations` and raised.
Without it, `owned` leaves the class as it is: no cost on the hot path.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable, List, Type, TypeVar

log = logging.getLogger(__name__)

OWNER_ATTRIBUTE = "_awa_owner_thread"
violations: List[str] = []

T = TypeVar("T")


class WrongThread(RuntimeError):
    """Scheduling state written from a thread that does not own it."""


def checking() -> bool:
    return os.environ.get("AWA_POOL_CHECK_OWNER") == "1"


def owned(cls: Type[T]) -> Type[T]:
    """Class decorator: instances bound to a thread (`bind`) refuse writes
    from any other (only when checking, as the class is defined)."""
    if not checking():
        return cls
    original: Callable[[Any, str, Any], None] = cls.__setattr__  # type: ignore[assignment]

    def __setattr__(self: Any, name: str, value: Any) -> None:
        owner = self.__dict__.get(OWNER_ATTRIBUTE)
        if owner is not None and name != OWNER_ATTRIBUTE and threading.get_ident() != owner:
            message = (f"{type(self).__name__}.{name} written from thread "
                       f"{threading.current_thread().name!r}, not the loop's")
            violations.append(message)
            log.error("%s", message)
            raise WrongThread(message)
        original(self, name, value)

    cls.__setattr__ = __setattr__  # type: ignore[assignment]
    return cls


def bind(*objects: Any) -> None:
    """From now on only the calling thread may write these objects."""
    if checking():
        for obj in objects:
            object.__setattr__(obj, OWNER_ATTRIBUTE, threading.get_ident())


def owner_of(obj: Any) -> Any:
    """The thread an object is bound to (None: unbound, or not checking)."""
    return getattr(obj, OWNER_ATTRIBUTE, None)
