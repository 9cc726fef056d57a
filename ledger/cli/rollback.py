"""``rollback --to-revision N [--plan]``: restore revision N's content by a new release."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from typing import Any

import click

from ledger.cli.app import cli, emit, json_option, lease_options, store
from ledger.cli.plan_render import render_plan

#: Colour of each pack action and of the digest comparison (on a terminal only).
_COLOURS = {"advance": "yellow", "reinstall": "cyan", "remove": "red", "unchanged": None}


def _colour() -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set (https://no-color.org)."""
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


def _paint(text: str, fg: str | None, *, on: bool, bold: bool = False) -> str:
    return click.style(text, fg=fg, bold=bold) if on and (fg or bold) else text


def _grant(g: dict[str, Any]) -> str:
    cred = f" [{g['credential_set']}]" if "credential_set" in g else ""
    return f"{g['audience']} {g['pack']} {g['kind']} {g['key']}{cred}"


def _shown(repo: str) -> str:
    """A repository path as the operator would write it: relative when it lies under the
    working directory (the JSON and the manifest keep the absolute path)."""
    try:
        relative = os.path.relpath(repo)
    except ValueError:
        return repo
    return repo if relative.startswith("..") else relative


def _pack_line(p: dict[str, Any], on: bool) -> str:
    action = _paint(p["action"], _COLOURS[p["action"]], on=on)
    was: dict[str, Any] = p.get("from") or {}
    to: dict[str, Any] = p.get("to") or {}
    if p["action"] == "unchanged":
        return f"  {p['pack']}: {action} at {to['revision'][:12]}"
    if p["action"] == "remove":
        return f"  {p['pack']}: {action} (active now: {was['revision'][:12]}, not at the revision)"
    where = f"{_shown(to['repo'])}@{to['revision'][:12]}:{to['path']}"
    if p["action"] == "reinstall":
        return f"  {p['pack']}: {action} {where} (removed since; a fresh incarnation)"
    return f"  {p['pack']}: {action} {was['revision'][:12]} -> {where} (a fresh generation)"


def manifest_lines(manifest: dict[str, Any]) -> list[str]:
    """The manifest as the examples write one: a line per pack, binding and removal."""
    lines = ["{"]
    sections = [k for k in ("packs", "bindings", "remove") if k in manifest]
    for n, key in enumerate(sections):
        items = [dump_compact(item) for item in manifest[key]]
        end = "," if n < len(sections) - 1 else ""
        if not items:
            lines.append(f' "{key}": []{end}')
            continue
        lines.append(f' "{key}": [')
        lines.extend(f"   {item}," for item in items[:-1])
        lines.append(f"   {items[-1]}]{end}")
    lines.append("}")
    return lines


def dump_compact(value: Any) -> str:
    """One JSON value on one line, with a space after each separator (readable)."""
    return json.dumps(value, ensure_ascii=False)


def render(result: Mapping[str, Any], on: bool) -> None:
    """The human output: the summary line first, then packs, bindings, digests, notes."""
    n = result["to_revision"]
    head = f"rollback plan to revision {n}" if result["plan"] else f"rollback to revision {n}"
    tail = ""
    if not result["plan"]:
        published = result.get("published")
        tail = f"; published revision {published['revision']}" if published else "; nothing new"
        if "blocked" in result["apply"]["catalog"]:
            tail = "; NOT published"
    click.echo(_paint(f"{head}: {result['summary']}{tail}", None, on=on, bold=True))
    for p in result["packs"]:
        click.echo(_pack_line(p, on))
    for verb, key in (("restore", "restore"), ("revoke", "revoke")):
        for g in result["bindings"][key]:
            click.echo(f"  binding {verb}: {_grant(g)}")
    if result["changed_audiences"]:
        click.echo("  audiences whose content changes: " + ", ".join(result["changed_audiences"]))
    target, current = result["target"], result["current"]
    after = result.get("published") or current
    click.echo("  payload-equivalence digest:")
    click.echo(f"    revision {target['revision']}: {target['payload_equivalence_digest']}")
    if after is not None:
        label = "now" if result["plan"] or "published" not in result else "published"
        same = result["equivalent"]
        verdict = _paint("equal" if same else "differs", "green" if same else "red", on=on)
        click.echo(
            f"    revision {after['revision']} ({label}): "
            f"{after['payload_equivalence_digest']} {verdict}"
        )
    if "published" in result:
        published = result["published"]
        same = published["content_digest"] == target["content_digest"]
        why = "the same generations" if same else "new install ids and epochs, R7/R17"
        click.echo(f"  content digest ({why}):")
        click.echo(f"    revision {target['revision']}: {target['content_digest']}")
        click.echo(
            f"    revision {published['revision']} (published): {published['content_digest']}"
        )
    local = result["left_alone"]["local_path"]
    for note in result["left_alone"]["notes"]:
        extra = f": {', '.join(local)}" if note.startswith("local_path") and local else ""
        click.echo(f"  note: {note}{extra}")
    if not result["plan"]:
        applied = result["apply"]
        click.echo(f"  applied as apply {applied['command_id']}")
        if "blocked" in applied["catalog"]:
            message = applied["catalog"]["blocked"]["message"]
            click.echo(_paint(f"  NOT published: {message}", "red", on=on))
    if result["plan"]:
        click.echo("  release manifest (applied by `catalog-ledger rollback` without --plan):")
        for line in manifest_lines(result["manifest"]):
            click.echo(f"    {line}")
        if "apply_plan" in result:  # apply's own plan of that manifest (apply --plan)
            click.echo("  what applying it does:")
            render_plan(result["apply_plan"])


@cli.command()
@click.option(
    "--to-revision",
    "to_revision",
    required=True,
    metavar="N",
    help="The published revision whose content to restore.",
)
@click.option(
    "--plan",
    is_flag=True,
    help="Show the release (its manifest) and what it would change; append nothing.",
)
@lease_options
@json_option
def rollback(to_revision: str, plan: bool, wait: float, lease_ttl: float, as_json: bool) -> None:
    """Restore revision N's content with a new release, applied like `apply`.

    Packs go back to fresh generations of the sources revision N bound, packs
    removed since are installed again (fresh incarnations), packs added since are
    removed, and N's bindings are restored. The new revision serves what N served
    (compared by the payload-equivalence digest); its install ids and epochs are
    new, so its content digest is not N's. local_path packs are left alone and
    credentials are not rolled back. A source that can't be resolved any more is
    INVALID, naming it, before anything is appended.
    """
    result = store().rollback(to_revision, plan=plan, wait=wait, lease_ttl=lease_ttl)
    emit(as_json, result, lambda: render(result, _colour()))
