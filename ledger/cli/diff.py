"""``diff``: what changed between two catalog revisions, from the log alone (R17, R28).

Human output reads top down: the summary line first, then each audience that changed,
then the pack activations that moved. Colour only when stdout is a terminal and
``NO_COLOR`` is unset (https://no-color.org); ``--json`` prints the typed result the
Python API's ``Store.diff`` returns.
"""

from __future__ import annotations

import os
import sys
import unicodedata
from typing import TYPE_CHECKING, Any

import click
import orjson

from ledger.cli.app import cli, emit, json_option, store

if TYPE_CHECKING:
    from ledger.audit.diff import ActivationMove, AudienceDiff, RevisionDiff


def use_colour() -> bool:
    """Colour on a terminal only, and never when ``NO_COLOR`` is set to anything."""
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


_COLOUR = {"+": "green", "-": "red"}


def _short(value: str | None) -> str:
    """A digest, install id or commit as people read it: its first 12 characters (after
    a ``v1:`` style prefix). ``--json`` has every value in full."""
    if value is None:
        return "none"
    prefix, colon, rest = value.rpartition(":")
    return f"{prefix}{colon}{rest[:12]}"


#: Characters of a JSON value a human line shows; ``--json`` has every value whole.
PREVIEW = 100


def _json(value: Any) -> str:
    """``value`` as compact JSON, cut to ``PREVIEW`` characters (a schema's payload can
    run to kilobytes: one line stays one line)."""
    text = orjson.dumps(value).decode()
    if len(text) <= PREVIEW:
        return text
    return f"{text[:PREVIEW]}... ({len(text)} characters)"


def _printable(text: str) -> str:
    """``text`` with control characters written as ``\\uXXXX``: a payload's keys and
    values may hold ESC or a C1 control (compact JSON leaves DEL and C1 raw), and none
    reaches the terminal raw."""
    if text.isprintable():  # no control character (nor any other non-printable one)
        return text
    return "".join(f"\\u{ord(c):04x}" if unicodedata.category(c) == "Cc" else c for c in text)


def _cred(credential_set: str | None) -> str:
    return "" if credential_set is None else f" ({credential_set})"


class _Printer:
    def __init__(self, colour: bool) -> None:
        self.colour = colour

    def line(self, text: str, fg: str | None = None, bold: bool = False) -> None:
        text = _printable(text)
        if self.colour and (fg is not None or bold):
            text = click.style(text, fg=fg, bold=bold)
        click.echo(text, color=self.colour)

    def audience(self, found: AudienceDiff) -> None:
        self.line("")
        self.line(
            f"{found['audience']}: {found['change']} (digest {_short(found['from_digest'])} "
            f"-> {_short(found['to_digest'])})",
            bold=True,
        )
        for fact in found["facts_added"]:
            self.fact("+", fact)
        for change in found["facts_changed"]:
            self.line(
                f"  ~ fact {change['pack']} {change['kind']}/{change['key']} "
                f"[{_short(change['from']['install_id'])} -> {_short(change['to']['install_id'])}]",
                "yellow",
            )
            for step in change["changes"]:
                path = step["path"] or "/"
                if step["op"] == "add":
                    self.line(f"      {path}: added {_json(step.get('to'))}", "green")
                elif step["op"] == "remove":
                    self.line(f"      {path}: removed {_json(step.get('from'))}", "red")
                else:
                    self.line(
                        f"      {path}: {_json(step.get('from'))} -> {_json(step.get('to'))}",
                        "yellow",
                    )
        for fact in found["facts_removed"]:
            self.fact("-", fact)
        for grant in found["grants_added"]:
            self.grant("+", grant)
        for grant in found["grants_removed"]:
            self.grant("-", grant)
        # Grants that only follow their pack to a new generation, one line per pack.
        rebound: dict[tuple[str, str, str], int] = {}
        for moved in found["grants_rebound"]:
            pair = (moved["pack"], moved["from_install_id"], moved["to_install_id"])
            rebound[pair] = rebound.get(pair, 0) + 1
        for (pack, before, after), count in rebound.items():
            noun = "grant" if count == 1 else "grants"
            self.line(
                f"  > {count} {noun} of {pack} rebound [{_short(before)} -> {_short(after)}]",
                "cyan",
            )

    def fact(self, sign: str, fact: Any) -> None:
        """One fact added (``+``, green) or removed (``-``, red), with its payload."""
        self.line(
            f"  {sign} fact {fact['pack']} {fact['kind']}/{fact['key']} "
            f"[{_short(fact['install_id'])}] {_json(fact['payload'])}",
            _COLOUR[sign],
        )

    def grant(self, sign: str, grant: Any) -> None:
        """One grant added (``+``, green) or removed (``-``, red)."""
        self.line(
            f"  {sign} grant {grant['pack']} {grant['kind']}/{grant['key']}"
            f"{_cred(grant['credential_set'])} [{_short(grant['install_id'])}]",
            _COLOUR[sign],
        )

    def activations(self, moves: list[ActivationMove]) -> None:
        if not moves:
            return
        self.line("")
        self.line("pack activations:", bold=True)
        for move in moves:
            before, after = move["from"], move["to"]
            if before is None or after is None:
                side = after if before is None else before
                assert side is not None
                self.line(
                    f"  {'+' if before is None else '-'} {move['pack']}: {move['change']} "
                    f"(install {_short(side['install_id'])}, revision {_short(side['revision'])}, "
                    f"epoch {side['epoch']})",
                    "green" if before is None else "red",
                )
                continue
            fields = (
                ("install", before["install_id"], after["install_id"]),
                ("revision", before["revision"], after["revision"]),
                ("epoch", str(before["epoch"]), str(after["epoch"])),
            )
            parts = [f"{name} {_short(x)} -> {_short(y)}" for name, x, y in fields if x != y]
            if before["payload_hash"] != after["payload_hash"]:
                parts.append("payload changed")
            self.line(f"  ~ {move['pack']}: {', '.join(parts)}", "yellow")


def render(result: RevisionDiff, colour: bool) -> None:
    """The human output of ``diff`` (summary line first)."""
    from ledger.audit.diff import summary_line

    out = _Printer(colour)
    out.line(summary_line(result), bold=True)
    a, b = result["from"], result["to"]
    scope = "" if result["audience"] is None else f", audience {result['audience']}"
    out.line(
        f"revision {a['revision']} -> {b['revision']} (content {_short(a['content_digest'])} "
        f"-> {_short(b['content_digest'])}{scope})"
    )
    for found in result["audiences"]:
        out.audience(found)
    out.activations(result["activations"])


@cli.command()
@click.option(
    "--from-revision",
    "from_revision",
    required=True,
    metavar="A",
    help="The revision to compare from.",
)
@click.option(
    "--to-revision",
    "to_revision",
    required=True,
    metavar="B",
    help="The revision to compare to (A > B is the reverse diff; A = B is empty).",
)
@click.option(
    "--audience",
    default=None,
    metavar="AUDIENCE",
    help="Only this audience (app:<id> or integration:<id>) and the packs it is served from.",
)
@json_option
def diff(from_revision: str, to_revision: str, audience: str | None, as_json: bool) -> None:
    """What changed from revision A to revision B, replayed from the log alone: per
    audience, facts added, removed or changed (with a payload diff) and grants added,
    removed or rebound; per pack, activations moved (install id, revision, epoch).
    It matches `view AUDIENCE --at-revision` on both sides; no view row is trusted (R28)."""
    result = store().diff(from_revision, to_revision, audience=audience)
    emit(as_json, result, lambda: render(result, use_colour()))
