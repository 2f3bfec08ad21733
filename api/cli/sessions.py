"""`isosweep sessions list|revoke`: the dashboard's login sessions, for the operator (straight on
the database, like `isosweep runner`; service/store/logins.py). A revoked session's cookie is
refused by every server of that database at its next request.

    isosweep sessions list              # id, state, address, created, last used, expires
    isosweep sessions revoke 3          # one session
    isosweep sessions revoke --all      # every session (rotating the token does this too)
"""

from __future__ import annotations

import argparse

from api.cli.common import CommandError, out
from api.cli.run import add_database_url, open_store


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "sessions",
        help="list or revoke the dashboard's login sessions",
        description="The dashboard's login sessions in the database (ISOSWEEP_DATABASE_URL): "
        "list them, or revoke one or all (its cookie is refused at its next request).",
    )
    sub = p.add_subparsers(dest="sessions_command", metavar="ACTION", required=True)
    listed = sub.add_parser("list", help="every session: state, address, times")
    add_database_url(listed)
    listed.set_defaults(func=run_list)
    revoke = sub.add_parser("revoke", help="end a session (by id), or --all")
    revoke.add_argument("session_id", nargs="?", type=int, help="the session's id (from list)")
    revoke.add_argument("--all", action="store_true", help="revoke every session")
    add_database_url(revoke)
    revoke.set_defaults(func=run_revoke)


def _when(t) -> str:
    return "-" if t is None else t.strftime("%Y-%m-%d %H:%M:%S")


def run_list(args: argparse.Namespace) -> int:
    from api.cli.display import table
    from service.store.logins import LoginSessions

    with open_store(args.database_url) as store:
        sessions = LoginSessions(store).list()
    t = table(None, ["id", "state", "address", "created", "last used", "expires", "revoked"])
    for s in sessions:
        t.add_row(
            str(s.id), s.state, s.client or "-", _when(s.created_at), _when(s.last_used_at),
            _when(s.expires_at), _when(s.revoked_at),
        )  # fmt: skip
    out.print(t)
    live = sum(s.active for s in sessions)
    out.print(f"{len(sessions)} sessions, {live} active (times in UTC)")
    return 0


def run_revoke(args: argparse.Namespace) -> int:
    from service.errors import InvalidInput
    from service.store.logins import LoginSessions

    if args.all == (args.session_id is not None):
        raise CommandError("give a session id or --all (not both)", code=2)
    with open_store(args.database_url) as store:
        logins = LoginSessions(store)
        if args.all:
            n = logins.revoke_all()
            out.print(f"revoked {n} session{'s' if n != 1 else ''}")
            return 0
        try:
            done = logins.revoke(args.session_id)
        except InvalidInput as exc:
            raise CommandError(exc.message) from None
    out.print(
        f"revoked session {args.session_id}"
        if done
        else f"session {args.session_id} was already revoked"
    )
    return 0
