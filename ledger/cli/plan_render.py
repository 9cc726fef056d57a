"""The human rendering of ``apply --plan``: the summary line first, then one line per
pack, binding and audience. Coloured only on a terminal, and never when ``NO_COLOR`` is
set (https://no-color.org)."""

from __future__ import annotations

import os
import sys
from typing import Any

import click

#: Decision -> (sign, colour).
_MARKS = {
    "install": ("+", "green"),
    "adopt": ("+", "green"),
    "advance": ("~", "yellow"),
    "local_update": ("~", "yellow"),
    "remove": ("-", "red"),
    "unchanged": (" ", None),
}
_OPS = {
    "granted": ("+", "grant", "green"),
    "rebound": ("~", "rebind", "yellow"),
    "revoked": ("-", "revoke", "red"),
}


def coloured() -> bool:
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


def _short(value: str | None, n: int = 12) -> str:
    if value is None:
        return "-"
    return value if len(value) <= n else value[:n]


def render_plan(plan: Any) -> None:
    """Print ``plan`` (a ``PlanResult``, as ``Store.plan`` returns it)."""
    colour = coloured()

    def line(text: str, fg: str | None = None, bold: bool = False) -> None:
        click.echo(click.style(text, fg=fg, bold=bold) if colour and (fg or bold) else text)

    line(f"plan {plan['command_id']}: {plan['summary']}", bold=True)
    for pack in plan["packs"]:
        sign, fg = _MARKS.get(pack["decision"], ("?", None))
        moves = pack["decision"] not in ("unchanged", "remove")
        if moves and (pack["from_revision"], pack["from_payload_hash"]) != (None, None):
            where = (
                f"{_short(pack['from_revision'])} -> {_short(pack['revision'])} "
                f"(payload {_short(pack['from_payload_hash'], 19)} -> "
                f"{_short(pack['payload_hash'], 19)})"
            )
        else:
            where = f"{_short(pack['revision'])} (payload {_short(pack['payload_hash'], 19)})"
        line(f"  {sign} {pack['pack']}: {pack['decision']} {where}", fg)
    for op, (sign, verb, fg) in _OPS.items():
        for binding in plan["bindings"][op]:
            line(f"  {sign} {verb} {_binding(binding)}", fg)
    for audience in plan["audiences"]:
        if audience["loses_all_grants"]:
            line(f"  ! audience {audience['audience']}: loses all its grants", "red", bold=True)
        else:
            line(f"  ~ audience {audience['audience']}: digest {_short(audience['digest'], 16)}")
    catalog, refused = plan["catalog"], plan["refused"]
    if refused is not None:
        line(f"  REFUSED [{refused['error']}]: {refused['message']}", "red", bold=True)
    elif catalog is not None:
        if catalog["published"]:
            text = f"  revision {catalog['revision']} would be published, digest "
            line(text + str(catalog["content_digest"]), "cyan")
        elif "blocked" in catalog:
            line(f"  NOT published: {catalog['blocked']['message']}", "red")
        else:
            line(f"  revision {catalog['revision']} stays in force")


def _binding(binding: Any) -> str:
    cred = binding.get("credential_set")
    extra = f" [{cred}]" if cred else ""
    return f"{binding['audience']} {binding['pack']} {binding['kind']}/{binding['key']}{extra}"
