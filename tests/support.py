"""Small helpers shared by tests (no fakes of the database: real engines only)."""

from __future__ import annotations

from eventsourcing.domain import Aggregate, event


class Note(Aggregate):
    """A minimal aggregate for exercising the log itself."""

    @event("Created")
    def __init__(self, name: str) -> None:
        self.name = name
        self.lines: list[str] = []

    @event("Written")
    def write(self, text: str) -> None:
        self.lines.append(text)
