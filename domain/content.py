"""Pack content (``pack.json``): validation, the canonical component set, payload hashes.

The payload hash is taken over the canonical component set: components sorted
bytewise by (kind, key), each with its ``requires`` sorted and its
``credential_sets`` sorted, encoded by the one canonical encoder. The order of
components (or of requirements) in the file therefore never changes the hash;
any byte of any payload does.

* v1 = BLAKE3 (payload context) of the canonical bytes — the current hash.
* v0 = SHA-256 hex of the same canonical bytes — legacy, accepted only as
  adoption proof (R7).

The input schema of ``pack.json`` (pydantic models) is ``domain.content_schema``.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from domain.canonical import canonical_bytes, check_canonical
from domain.digests import Purpose, digest
from domain.errors import InvalidInput
from domain.identity import BusinessKey, Category, ComponentKind, CredentialSet, PackName

# The fact digest lives in the pure module the runtime client shares (one definition).
from domain.served import fact_digest as fact_digest  # noqa: PLC0414 - re-exported
from domain.served import fact_hasher as fact_hasher  # noqa: PLC0414 - re-exported

_HASH = re.compile(r"(v0|v1):([0-9a-f]{64})")


@dataclass(frozen=True)
class Requirement:
    kind: ComponentKind
    key: BusinessKey
    pack: PackName | None

    def sort_key(self) -> tuple[str, str, str]:
        return (self.pack or "", self.kind, self.key)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "key": self.key, "pack": self.pack}


@dataclass(frozen=True)
class Component:
    """One typed immutable fact of a pack."""

    kind: ComponentKind
    key: BusinessKey
    payload: Any
    requires: tuple[Requirement, ...]
    credential_sets: tuple[CredentialSet, ...] | None

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "key": self.key,
            "payload": self.payload,
            "requires": [r.to_json() for r in self.requires],
            "credential_sets": list(self.credential_sets)
            if self.credential_sets is not None
            else None,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Component:
        """Rebuild from the log (validated when it was written)."""
        creds = data.get("credential_sets")
        return cls(
            kind=ComponentKind.trusted(data["kind"]),
            key=BusinessKey.trusted(data["key"]),
            payload=data["payload"],
            requires=tuple(
                Requirement(
                    ComponentKind.trusted(r["kind"]),
                    BusinessKey.trusted(r["key"]),
                    PackName.trusted(r["pack"]) if r.get("pack") is not None else None,
                )
                for r in data.get("requires") or []
            ),
            credential_sets=tuple(CredentialSet.trusted(c) for c in creds)
            if creds is not None
            else None,
        )


@dataclass(frozen=True)
class PackContent:
    """Validated pack content in canonical order, with its payload hashes."""

    name: PackName
    category: Category
    components: tuple[Component, ...]

    def canonical_set(self) -> list[dict[str, Any]]:
        return [c.to_json() for c in self.components]

    def canonical_bytes(self) -> bytes:
        return self._canonical

    # Content is immutable: its canonical bytes and hashes are computed once (an apply
    # asks for them at several steps, for every pack of the manifest).
    @cached_property
    def _canonical(self) -> bytes:
        return canonical_bytes(self.canonical_set())

    @cached_property
    def payload_hash_v1(self) -> str:
        return "v1:" + digest(Purpose.PAYLOAD_V1, self.canonical_bytes()).hex()

    @cached_property
    def payload_hash_v0(self) -> str:
        return "v0:" + hashlib.sha256(self.canonical_bytes()).hexdigest()

    def proves(self, stored_hash: str) -> bool:
        """Does a stored ``v1:``/``v0:`` hash prove this exact content (R7)?"""
        return stored_hash in (self.payload_hash_v1, self.payload_hash_v0)


def hash_problem(value: object) -> str | None:
    """Why a stored payload hash is unusable as proof, or ``None``."""
    if value is None:
        return "missing"
    if not isinstance(value, str) or not _HASH.fullmatch(value):
        return "malformed (expected v1:<64 hex> or v0:<64 hex>)"
    return None


def parse_pack_content(data: Any, *, file: str, expected_name: str | None = None) -> PackContent:
    """Validate ``pack.json`` data; every error names ``file`` and the field."""
    # The input schema (pydantic) is imported by the commands that validate input only:
    # reading a store never needs it (issue 25.7).
    from pydantic import ValidationError

    from domain.content_schema import PackContentModel, invalid_from

    try:
        model = PackContentModel.model_validate(data)
    except ValidationError as exc:
        raise invalid_from(exc, file=file) from None
    if expected_name is not None and model.name != expected_name:
        raise InvalidInput(
            f"{file}: name: {model.name!r} does not equal the manifest's pack name "
            f"{expected_name!r} byte for byte",
            field="name",
            file=file,
        )
    seen: dict[tuple[str, str], int] = {}
    components = []
    for index, comp in enumerate(model.components):
        ident = (comp.kind, comp.key)
        if ident in seen:
            raise InvalidInput(
                f"{file}: components[{index}]: duplicate kind+key {comp.kind!r}/{comp.key!r} "
                f"(first at components[{seen[ident]}])",
                field=f"components[{index}].key",
                file=file,
            )
        seen[ident] = index
        try:
            check_canonical(comp.payload, path=f"components[{index}].payload")
        except InvalidInput as exc:
            raise InvalidInput(f"{file}: {exc.message}", field=exc.field, file=file) from None
        # A requirement naming this very pack means the same as naming none.
        requires = tuple(
            sorted(
                {
                    Requirement(
                        ComponentKind.trusted(r.kind),
                        BusinessKey.trusted(r.key),
                        PackName.trusted(r.pack)
                        if r.pack is not None and r.pack != model.name
                        else None,
                    )
                    for r in comp.requires
                },
                key=Requirement.sort_key,
            )
        )
        if len(requires) != len(comp.requires):
            raise InvalidInput(
                f"{file}: components[{index}].requires lists the same requirement twice",
                field=f"components[{index}].requires",
                file=file,
            )
        creds = None
        if comp.credential_sets is not None:
            creds = tuple(sorted({CredentialSet.trusted(c) for c in comp.credential_sets}))
            if len(creds) != len(comp.credential_sets):
                raise InvalidInput(
                    f"{file}: components[{index}].credential_sets lists a set twice",
                    field=f"components[{index}].credential_sets",
                    file=file,
                )
        components.append(
            Component(
                kind=ComponentKind.trusted(comp.kind),
                key=BusinessKey.trusted(comp.key),
                payload=comp.payload,
                requires=requires,
                credential_sets=creds,
            )
        )
    by_ident = {(c.kind, c.key) for c in components}
    for index, comp in enumerate(model.components):
        for r_index, req in enumerate(comp.requires):
            local = req.pack is None or req.pack == model.name
            if (req.kind, req.key) == (comp.kind, comp.key) and local:
                raise InvalidInput(
                    f"{file}: components[{index}].requires[{r_index}]: a component cannot "
                    "require itself",
                    field=f"components[{index}].requires[{r_index}]",
                    file=file,
                )
            if local and (req.kind, req.key) not in by_ident:
                raise InvalidInput(
                    f"{file}: components[{index}].requires[{r_index}]: no component "
                    f"{req.kind!r}/{req.key!r} in this pack",
                    field=f"components[{index}].requires[{r_index}]",
                    file=file,
                )
    components.sort(key=lambda c: (c.kind, c.key))
    return PackContent(
        name=PackName.trusted(model.name),
        category=Category.trusted(model.category),
        components=tuple(components),
    )
