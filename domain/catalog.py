"""Bindings (R14) and catalog revisions (R16, R17) as aggregates.

``AudienceBindings`` records, per audience, every grant, revoke and re-bind of
one component of one pack's exact active generation (install id + payload
digest). Its events carry everything they are about; the current binding set
is a projection of them, so the aggregate itself keeps only its identity and
its version (the version is the read fence of that audience's bindings).

``Catalog`` records every published revision: number, content digest, parent
digest, the activations bound (as a change against the parent) and the
digests of the audiences whose view changed. The grants of revision n are
the bindings in force at the position of its event (publication appends only
when every binding validated), and its facts are the components of the bound
generations, already in the log since their preparation.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from eventsourcing.domain import Aggregate, event

from domain.digests import aggregate_id

CATALOG_NAME = "catalog"


class AudienceBindings(Aggregate):
    """Grants of one audience (``app:<id>`` or ``integration:<id>``)."""

    class Opened(Aggregate.Created):
        audience_kind: str
        audience_id: str

    class Granted(Aggregate.Event):
        audience_kind: str
        audience_id: str
        pack: str
        kind: str
        key: str
        credential_set: str | None
        install_id: str
        payload_hash: str

    class Rebound(Aggregate.Event):
        audience_kind: str
        audience_id: str
        pack: str
        kind: str
        key: str
        credential_set: str | None
        from_install_id: str
        install_id: str
        payload_hash: str

    class Revoked(Aggregate.Event):
        audience_kind: str
        audience_id: str
        pack: str
        kind: str
        key: str
        credential_set: str | None
        #: Schema v2: the install id the revoked binding named (v1 rows: None).
        install_id: str | None

    @staticmethod
    def create_id(audience_kind: str, audience_id: str, **_: Any) -> UUID:
        return audience_bindings_id(audience_kind, audience_id)

    @event(Opened)
    def __init__(self, audience_kind: str, audience_id: str) -> None:
        self.audience_kind = audience_kind
        self.audience_id = audience_id

    @event(Granted)
    def _granted(
        self,
        audience_kind: str,
        audience_id: str,
        pack: str,
        kind: str,
        key: str,
        credential_set: str | None,
        install_id: str,
        payload_hash: str,
    ) -> None:
        pass

    @event(Rebound)
    def _rebound(
        self,
        audience_kind: str,
        audience_id: str,
        pack: str,
        kind: str,
        key: str,
        credential_set: str | None,
        from_install_id: str,
        install_id: str,
        payload_hash: str,
    ) -> None:
        pass

    @event(Revoked)
    def _revoked(
        self,
        audience_kind: str,
        audience_id: str,
        pack: str,
        kind: str,
        key: str,
        credential_set: str | None,
        install_id: str | None,
    ) -> None:
        pass

    def _who(self) -> dict[str, str]:
        return {"audience_kind": self.audience_kind, "audience_id": self.audience_id}

    def grant(
        self,
        pack: str,
        kind: str,
        key: str,
        credential_set: str | None,
        install_id: str,
        payload_hash: str,
    ) -> None:
        """Bind a component of the pack's exact active generation (R14)."""
        self._granted(
            **self._who(),
            pack=pack,
            kind=kind,
            key=key,
            credential_set=credential_set,
            install_id=install_id,
            payload_hash=payload_hash,
        )

    def rebind(
        self,
        pack: str,
        kind: str,
        key: str,
        credential_set: str | None,
        from_install_id: str,
        install_id: str,
        payload_hash: str,
    ) -> None:
        """Move a binding to the pack's newly activated generation."""
        self._rebound(
            **self._who(),
            pack=pack,
            kind=kind,
            key=key,
            credential_set=credential_set,
            from_install_id=from_install_id,
            install_id=install_id,
            payload_hash=payload_hash,
        )

    def revoke(
        self, pack: str, kind: str, key: str, credential_set: str | None, install_id: str
    ) -> None:
        """Withdraw a binding; the event names the generation it pointed at."""
        self._revoked(
            **self._who(),
            pack=pack,
            kind=kind,
            key=key,
            credential_set=credential_set,
            install_id=install_id,
        )


class Catalog(Aggregate):
    """The published catalog lineage: one event per revision."""

    class Opened(Aggregate.Created):
        name: str

    class Published(Aggregate.Event):
        revision: int
        content_digest: str
        parent_digest: str | None
        #: Packs whose bound activation is new or changed: [pack, install_id,
        #: revision, epoch, payload_hash]; and packs the catalog no longer uses.
        activations: list[list[Any]]
        released_packs: list[str]
        #: Audiences whose view changed: [kind, id, digest hex or None if gone].
        audiences: list[list[Any]]
        counts: dict[str, int]
        #: The log position bindings were read at (None: all before this event).
        bindings_position: int | None
        #: Schema v2: the audience map's root over every audience in force
        #: (``domain.audience_map``); from v2 on ``audiences`` is always empty and each
        #: changed audience is its own ``audience_view.published`` event in the same
        #: append (v1 rows: None).
        audiences_root: str | None

    @staticmethod
    def create_id(name: str = CATALOG_NAME, **_: Any) -> UUID:
        return catalog_id()

    @event(Opened)
    def __init__(self, name: str) -> None:
        self.name = name
        self.revision = 0
        self.content_digest: str | None = None

    @event(Published)
    def _published(
        self,
        revision: int,
        content_digest: str,
        parent_digest: str | None,
        activations: list[list[Any]],
        released_packs: list[str],
        audiences: list[list[Any]],
        counts: dict[str, int],
        bindings_position: int | None,
        audiences_root: str | None,
    ) -> None:
        self.revision = revision
        self.content_digest = content_digest

    def publish(
        self,
        content_digest: str,
        activations: list[list[Any]],
        released_packs: list[str],
        counts: dict[str, int],
        bindings_position: int | None,
        audiences_root: str,
    ) -> None:
        """Append revision n+1 with the parent's digest (R17). The audiences whose view
        changed are ``PublishedView`` events of the same append, not listed here."""
        self._published(
            revision=self.revision + 1,
            content_digest=content_digest,
            parent_digest=self.content_digest,
            activations=activations,
            released_packs=released_packs,
            audiences=[],
            counts=counts,
            bindings_position=bindings_position,
            audiences_root=audiences_root,
        )


class PublishedView(Aggregate):
    """One audience's published view digests: an event per revision that changed it.

    Appended in the revision's own append, before its ``catalog.published`` event, for
    every audience whose view digest differs from the one its last event recorded (a
    store's first revision of this format records every audience in force). The last
    event answers "this audience's digest now" in one index seek (R28); the revision's
    ``audiences_root`` commits all of them at once (``domain.audience_map``).
    """

    class Opened(Aggregate.Created):
        audience_kind: str
        audience_id: str

    class Published(Aggregate.Event):
        audience_kind: str
        audience_id: str
        revision: int
        #: The audience's view digest at ``revision`` (None: it has no grants any more).
        digest: str | None

    @staticmethod
    def create_id(audience_kind: str, audience_id: str, **_: Any) -> UUID:
        return published_view_id(audience_kind, audience_id)

    @event(Opened)
    def __init__(self, audience_kind: str, audience_id: str) -> None:
        self.audience_kind = audience_kind
        self.audience_id = audience_id

    @event(Published)
    def _published(
        self, audience_kind: str, audience_id: str, revision: int, digest: str | None
    ) -> None:
        pass

    def publish(self, revision: int, digest: str | None) -> None:
        self._published(
            audience_kind=self.audience_kind,
            audience_id=self.audience_id,
            revision=revision,
            digest=digest,
        )


def published_view_id(audience_kind: str, audience_id: str) -> UUID:
    return aggregate_id("audience view", audience_kind, audience_id)


def audience_bindings_id(audience_kind: str, audience_id: str) -> UUID:
    return aggregate_id("audience", audience_kind, audience_id)


def catalog_id() -> UUID:
    return aggregate_id("catalog", CATALOG_NAME)
