"""Transactional enqueue from SQLAlchemy 2: a sign-up saves the user and
enqueues the welcome e-mail in the Session's transaction, so a sign-up that
fails (here: an e-mail address already taken) leaves no job behind.

    DATABASE_URL=postgresql://... python examples/sqlalchemy_app.py alice@example.com
    cd examples && awa-pool start --app sqlalchemy_app      # runs send_welcome

`--driver psycopg2` picks the psycopg2 dialect; the default is psycopg (3).
"""
from __future__ import annotations

import argparse
import json
import os
from typing import List, Optional

from sqlalchemy import String, create_engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import awa_pool


class Base(DeclarativeBase):
    pass


class User(Base):
    __tablename__ = "example_users"
    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(200), unique=True)


@awa_pool.task("send_welcome", max_attempts=5)
def send_welcome(user_id: int, email: str) -> dict:
    # a real app would render and send the e-mail here
    return {"user_id": user_id, "sent_to": email}


def sign_up(session: Session, email: str) -> Optional[int]:
    """Create the user and enqueue the welcome job; both or neither.
    Returns the job id, or None when the address is taken."""
    try:
        user = User(email=email)
        session.add(user)
        session.flush()                                   # the INSERT, to get user.id
        job_id = send_welcome.enqueue(session, user_id=user.id, email=email)
        session.commit()
        return job_id
    except IntegrityError:
        session.rollback()                                # the user row and the job go together
        return None


def sqlalchemy_url(database_url: str, driver: str) -> str:
    scheme, _, rest = database_url.partition("://")
    if scheme not in ("postgres", "postgresql"):
        raise SystemExit(f"DATABASE_URL must be a postgresql:// URL, got {scheme}://...")
    return f"postgresql+{driver}://{rest}"


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("emails", nargs="+")
    parser.add_argument("--driver", choices=["psycopg", "psycopg2"], default="psycopg")
    args = parser.parse_args(argv)
    database_url = os.environ.get("DATABASE_URL") or os.environ.get("AWA_DATABASE_URL")
    if not database_url:
        raise SystemExit("set DATABASE_URL to a PostgreSQL URL")
    engine = create_engine(sqlalchemy_url(database_url, args.driver))
    with engine.begin() as conn:                          # the queue's schema and the app's table
        awa_pool.migrate(conn)
        Base.metadata.create_all(conn)
    with Session(engine) as session:
        jobs = [[email, sign_up(session, email)] for email in args.emails]
    engine.dispose()
    print(json.dumps(jobs))                               # [[email, job id or null], ...]


if __name__ == "__main__":
    main()
