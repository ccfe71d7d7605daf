"""``DashboardSessionRepository`` of the in-memory store (issue 16 item 3): the sessions of
``dtq dev`` and of the unit tests.

Writes are staged on the transaction and applied by its commit, like every other write of the
fake; sessions and keys are frozen values and strings, so no copies are needed.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from dtq.domain.sessions import DashboardSession
from dtq.domain.tokens import ApiToken

if TYPE_CHECKING:
    from dtq.adapters.memory.store import _MemoryTransaction, _Tables


class SessionTables:
    """The committed sessions and keys (a part of the store's tables)."""

    def __init__(self) -> None:
        self.sessions: dict[str, DashboardSession] = {}
        self.keys: dict[str, str] = {}


class MemorySessions:
    """``DashboardSessionRepository`` over one memory transaction."""

    def __init__(self, tx: _MemoryTransaction, tables: _Tables) -> None:
        self._tx = tx
        self._t = tables.dashboard
        self._sessions: dict[str, DashboardSession | None] = {}  # None: deleted in this try
        self._keys: dict[str, str] = {}

    def _session(self, id_hash: str) -> DashboardSession | None:
        if id_hash in self._sessions:
            return self._sessions[id_hash]
        return self._t.sessions.get(id_hash)

    async def add(self, session: DashboardSession) -> None:
        self._sessions[session.id_hash] = session

    async def get(self, id_hash: str) -> tuple[DashboardSession, ApiToken] | None:
        session = self._session(id_hash)
        token = None if session is None else self._tx.token(session.token_id)
        return None if session is None or token is None else (session, token)

    async def delete(self, id_hash: str) -> bool:
        existed = self._session(id_hash) is not None
        self._sessions[id_hash] = None
        return existed

    async def delete_expired(self, before: datetime, limit: int) -> int:
        merged = {**self._t.sessions, **self._sessions}
        expired = sorted(
            (s.expires_at, s.id_hash)
            for s in merged.values()
            if s is not None and s.expires_at <= before
        )[:limit]
        for _, id_hash in expired:
            self._sessions[id_hash] = None
        return len(expired)

    async def key(self, name: str, candidate: str) -> str:
        found = self._keys.get(name) or self._t.keys.get(name)
        if found is None:
            found = self._keys[name] = candidate
        return found

    def commit(self) -> None:
        """Apply this try's writes to the committed tables."""
        for id_hash, session in self._sessions.items():
            if session is None:
                self._t.sessions.pop(id_hash, None)
            else:
                self._t.sessions[id_hash] = session
        self._t.keys.update(self._keys)
