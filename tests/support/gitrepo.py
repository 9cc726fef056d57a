"""Deterministic git repositories of pack content for tests (real `git`, fixed dates)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

_ENV = {
    "GIT_AUTHOR_NAME": "Catalog Ledger Tests",
    "GIT_AUTHOR_EMAIL": "tests@catalog-ledger.invalid",
    "GIT_COMMITTER_NAME": "Catalog Ledger Tests",
    "GIT_COMMITTER_EMAIL": "tests@catalog-ledger.invalid",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_CONFIG_NOSYSTEM": "1",
}


def git(repo: Path, *args: str, stamp: int = 0) -> str:
    env = dict(os.environ, **_ENV)
    env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = f"{1_780_000_000 + stamp} +0000"
    out = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, env=env, check=True
    )
    return out.stdout.strip()


def pack_json(
    name: str, category: str = "app", components: list[dict[str, Any]] | None = None, **extra: Any
) -> bytes:
    document = {"name": name, "category": category, "components": components or [], **extra}
    return json.dumps(document, ensure_ascii=False, indent=1).encode("utf-8")


def component(
    kind: str,
    key: str,
    payload: Any = None,
    *,
    requires: list[dict[str, str]] | None = None,
    credential_sets: list[str] | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "kind": kind,
        "key": key,
        "payload": payload if payload is not None else {"v": 1},
    }
    if requires is not None:
        out["requires"] = requires
    if credential_sets is not None:
        out["credential_sets"] = credential_sets
    return out


def push_pack(
    name: str,
    version: int,
    category: str = "app",
    *,
    push_payload: Any = None,
    profile_payload: Any = None,
    credential_sets: tuple[str, ...] = ("erp-prod", "erp-test"),
    **extra: Any,
) -> bytes:
    """A two-component pack whose payload changes with ``version``: a push contract that
    requires the pack's ``erp`` callout profile."""
    return pack_json(
        name,
        category,
        [
            component(
                "push_contract",
                "Order.push",
                push_payload if push_payload is not None else {"v": version},
                requires=[{"kind": "callout_profile", "key": "erp"}],
            ),
            component(
                "callout_profile",
                "erp",
                profile_payload if profile_payload is not None else {"url": "https://erp.example"},
                credential_sets=list(credential_sets),
            ),
        ],
        **extra,
    )


def push_closure(audience: str, pack: str, cred: str = "erp-prod") -> list[dict[str, Any]]:
    """Bindings of a ``push_pack``'s complete closure (push contract + profile); only the
    profile declares credential sets, so only its binding names one (R15)."""
    return [
        {"audience": audience, "pack": pack, "kind": "push_contract", "key": "Order.push"},
        {
            "audience": audience,
            "pack": pack,
            "kind": "callout_profile",
            "key": "erp",
            "credential_set": cred,
        },
    ]


def sales_doc(
    version: int = 1, name: str = "sales", *, stamp_all: bool = False, ping: bool = False
) -> dict[str, Any]:
    """The sales pack of DESIGN "Inputs": a push contract requiring a callout profile and
    an outbound mapping. ``stamp_all`` puts the version in every payload, ``ping`` adds
    a push contract with no requirements."""
    stamp = {"v": version} if stamp_all else {}
    components = [
        component(
            "push_contract",
            "Order.push",
            {"topic": "orders", "v": version},
            requires=[
                {"kind": "callout_profile", "key": "erp"},
                {"kind": "outbound_mapping", "key": "Order.out"},
            ],
        ),
        component(
            "callout_profile",
            "erp",
            {"url": "https://erp.example", **stamp},
            credential_sets=["erp-prod", "erp-test"],
        ),
        component("outbound_mapping", "Order.out", {"fields": ["id", "total"], **stamp}),
    ]
    if ping:
        components.append(component("push_contract", "Ping.push", {"v": version}))
    return {"name": name, "category": "app", "components": components}


def sales(version: int = 1, *, reverse: bool = False, **options: Any) -> bytes:
    """``sales_doc`` as pack.json bytes (components reversed: same content, other order)."""
    document = sales_doc(version, **options)
    if reverse:
        document["components"] = document["components"][::-1]
    return pack_json(**document)


def sales_closure(audience: str, cred: str = "erp-prod") -> list[dict[str, Any]]:
    """Bindings of the sales push contract's complete closure for one audience."""
    out: list[dict[str, Any]] = [
        {"kind": "push_contract", "key": "Order.push"},
        {"kind": "callout_profile", "key": "erp", "credential_set": cred},
        {"kind": "outbound_mapping", "key": "Order.out"},
    ]
    return [{"audience": audience, "pack": "sales", **b} for b in out]


class Repo:
    """A git repository that commits whole file sets and returns full commit ids."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        git(path, "init", "-q", "-b", "main")
        self.commits: list[str] = []

    def commit(self, files: dict[str, bytes], message: str = "release") -> str:
        for rel, data in files.items():
            target = self.path / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        git(self.path, "add", "-A")
        git(self.path, "commit", "-q", "--allow-empty", "-m", message, stamp=len(self.commits))
        commit = git(self.path, "rev-parse", "HEAD")
        self.commits.append(commit)
        return commit


def manifest(
    path: Path, packs: list[dict[str, Any]], bindings: list[dict[str, Any]] | None = None
) -> Path:
    document: dict[str, Any] = {"packs": packs}
    if bindings is not None:
        document["bindings"] = bindings
    path.write_text(json.dumps(document, indent=1), encoding="utf-8")
    return path


def official(name: str, repo: Path | str, revision: str, path: str = "pack.json") -> dict[str, Any]:
    return {
        "name": name,
        "source": {"kind": "official_repo", "repo": str(repo), "revision": revision, "path": path},
    }


def local(name: str, path: Path | str) -> dict[str, Any]:
    return {"name": name, "source": {"kind": "local_path", "path": str(path)}}
