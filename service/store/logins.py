"""The dashboard's login sessions, kept in the database (table `login_sessions`, migration 0006).

    logins = LoginSessions(store)
    key = logins.open(token, ttl_s=3600, client="10.0.0.7")   # the cookie's value
    logins.check(key, token)      # True while the session lives; notes when it was last used
    logins.revoke_key(key)        # logout: every copy of the cookie dies with it
    logins.list(); logins.revoke(3); logins.revoke_all()      # `isosweep sessions`

The cookie holds a random key (32 bytes, URL-safe); the row holds only its SHA-256, so a copy of
the table (a backup, a dump) opens no session. Each row also holds a tag of the token it was
opened with (an HMAC under the token): a session opened under another token is refused, so
rotating the token ends every session, and `revoke_other_tokens` (run by `isosweep serve` at
start) marks them revoked. A session lives until its expiry (Settings.session_ttl_s after the
login), its logout, or its revocation, whichever comes first.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select, update

from service.errors import InvalidInput
from service.store.models import SqlLoginSession, utcnow
from service.store.store import Store

KEY_BYTES = 32  # of randomness in a session key (43 URL-safe characters)
TOUCH_S = 60.0  # a session's last use is written at most this often (reads stay reads)
MAX_AGENT = 200  # characters of the User-Agent kept


def token_tag(token: str) -> str:
    """Which token a session was opened with, without being it: an HMAC of a fixed label."""
    return hmac.new(token.encode(), b"isosweep login session v2", hashlib.sha256).hexdigest()


def key_hash(key: str) -> str:
    """The stored form of a session key (any header text hashes: latin-1 as bytes)."""
    return hashlib.sha256(key.encode("latin-1", "replace")).hexdigest()


@dataclass(frozen=True)
class LoginSession:
    """One login session as the operator sees it (never its key)."""

    id: int
    client: str | None
    user_agent: str | None
    created_at: datetime
    last_used_at: datetime
    expires_at: datetime
    revoked_at: datetime | None

    @property
    def state(self) -> str:
        """ "active", "revoked" or "expired"."""
        if self.revoked_at is not None:
            return "revoked"
        return "active" if self.expires_at > utcnow() else "expired"

    @property
    def active(self) -> bool:
        return self.state == "active"


def _session(row: SqlLoginSession) -> LoginSession:
    return LoginSession(
        row.id, row.client, row.user_agent, row.created_at, row.last_used_at, row.expires_at,
        row.revoked_at,
    )  # fmt: skip


class LoginSessions:
    """The login sessions in `store`'s database; each method is one transaction (or two:
    `check` writes the last use only when it is over TOUCH_S old)."""

    def __init__(self, store: Store):
        self.store = store

    def open(
        self, token: str, *, ttl_s: float, client: str | None = None, user_agent: str | None = None
    ) -> str:
        """A new session under `token`, ending `ttl_s` from now; returns its key (the cookie)."""
        if not ttl_s > 0:
            raise InvalidInput("must be > 0 seconds", field="session_ttl_s")
        key = secrets.token_urlsafe(KEY_BYTES)
        now = utcnow()
        row = SqlLoginSession(
            key_hash=key_hash(key), token_tag=token_tag(token), client=(client or None),
            user_agent=(user_agent or "")[:MAX_AGENT] or None, created_at=now, last_used_at=now,
            expires_at=now + timedelta(seconds=ttl_s), revoked_at=None,
        )  # fmt: skip
        with self.store._write() as s:
            s.add(row)
        return key

    def check(self, key: str, token: str) -> bool:
        """Whether `key` opens a live session of `token` (not revoked, not expired, opened under
        this token); a use is noted (last_used_at) at most every TOUCH_S."""
        with self.store._read() as s:
            row = s.scalar(select(SqlLoginSession).where(SqlLoginSession.key_hash == key_hash(key)))
        now = utcnow()
        if row is None or row.revoked_at is not None or row.expires_at <= now:
            return False
        if not hmac.compare_digest(row.token_tag, token_tag(token)):
            return False
        if (now - row.last_used_at).total_seconds() >= TOUCH_S:
            with self.store._write() as s:
                s.execute(
                    update(SqlLoginSession)
                    .where(SqlLoginSession.id == row.id)
                    .values(last_used_at=now)
                )
        return True

    def _revoke(self, *where: object) -> int:
        with self.store._write() as s:
            done = s.execute(
                update(SqlLoginSession)
                .where(SqlLoginSession.revoked_at.is_(None), *where)  # type: ignore[arg-type]
                .values(revoked_at=utcnow())
            )
            return int(done.rowcount)  # type: ignore[attr-defined]  # an UPDATE: a CursorResult

    def revoke_key(self, key: str) -> bool:
        """End the session `key` opens (logout). False when none was live."""
        return self._revoke(SqlLoginSession.key_hash == key_hash(key)) == 1

    def revoke(self, session_id: int) -> bool:
        """End session `session_id`. False when it was already revoked.

        Raises:
            InvalidInput: no session has this id.
        """
        with self.store._read() as s:
            if s.get(SqlLoginSession, session_id) is None:
                raise InvalidInput(f"no session {session_id}", field="session_id")
        return self._revoke(SqlLoginSession.id == session_id) == 1

    def revoke_all(self) -> int:
        """End every session; returns how many were not revoked yet."""
        return self._revoke()

    def revoke_other_tokens(self, tag: str) -> int:
        """End every session opened under a token whose tag is not `tag` (the token changed)."""
        return self._revoke(SqlLoginSession.token_tag != tag)

    def list(self) -> list[LoginSession]:
        """Every session, oldest first."""
        with self.store._read() as s:
            rows = s.scalars(select(SqlLoginSession).order_by(SqlLoginSession.id)).all()
            return [_session(r) for r in rows]
