"""Small helpers shared by tests (no fakes of the database: real engines only)."""

from __future__ import annotations

from eventsourcing.domain import Aggregate, event

from domain.event_types import EVENT_TYPES, EventType


class Note(Aggregate):
    """A minimal aggregate for exercising the log itself."""

    @event("Created")
    def __init__(self, name: str) -> None:
        self.name = name
        self.lines: list[str] = []

    @event("Written")
    def write(self, text: str) -> None:
        self.lines.append(text)


# A test aggregate is a log event type like any other: registered by product name.
# (``@event("Written")`` makes the class at run time, so mypy cannot see it.)
EVENT_TYPES.register(EventType("test.note_created", Note.Created, Note))
EVENT_TYPES.register(EventType("test.note_written", Note.Written, Note))  # type: ignore[attr-defined]
