"""Pack content (``pack.json``): validation, the canonical component set, payload hashes.

The payload hash is taken over the canonical component set: components sorted
bytewise by (kind, key), each with its ``requires`` sorted and its
``credential_sets`` sorted, encoded by the one canonical encoder. The order of
components (or of requirements) in the file therefore never changes the hash;
any byte of any payload does.

* v1 = BLAKE3 (payload context) of the canonical bytes — the current hash.
* v0 = SHA-256 hex of the same canonical bytes — legacy, accepted only as
  adoption proof (R7).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from domain.canonical import canonical_bytes, check_canonical
from domain.digests import Purpose, digest
from domain.errors import InvalidInput
from domain.identity import (
    BusinessKey,
    Category,
    ComponentKind,
    CredentialSet,
    Identity,
    PackName,
)

# The fact digest lives in the pure module the runtime client shares (one definition).
from domain.served import fact_digest as fact_digest  # noqa: PLC0414 - re-exported
from domain.served import fact_hasher as fact_hasher  # noqa: PLC0414 - re-exported

_HASH = re.compile(r"(v0|v1):([0-9a-f]{64})")


def identity_check(cls: type[Identity]) -> Callable[[str], str]:
    def check(value: str) -> str:
        problem = cls.problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    return check


PackText = Annotated[str, AfterValidator(identity_check(PackName))]
KindText = Annotated[str, AfterValidator(identity_check(ComponentKind))]
KeyText = Annotated[str, AfterValidator(identity_check(BusinessKey))]
CredentialText = Annotated[str, AfterValidator(identity_check(CredentialSet))]
CategoryText = Annotated[str, AfterValidator(identity_check(Category))]


#: Input lists stop validating at their first bad element: a few MB of input can hold
#: millions of bad values, and collecting an error for each took seconds and gigabytes.
FirstError = Field(fail_fast=True)


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class RequirementModel(StrictModel):
    kind: KindText
    key: KeyText
    pack: PackText | None = None


class ComponentModel(StrictModel):
    kind: KindText
    key: KeyText
    payload: Any
    requires: Annotated[list[RequirementModel], FirstError] = Field(default_factory=list)
    credential_sets: Annotated[list[CredentialText], Field(min_length=1, fail_fast=True)] | None = (
        None
    )


class PackContentModel(StrictModel):
    name: PackText
    category: CategoryText
    components: Annotated[list[ComponentModel], FirstError]


#: Discriminator tags pydantic puts into error locations of tagged unions
#: (``source.official_repo.path``); they are not fields of the user's document.
UNION_TAGS = frozenset({"official_repo", "local_path"})


def loc_path(loc: Sequence[int | str]) -> str:
    """Pydantic's error location as the JSON path in the user's document:
    ``packs[2].source.path`` (union tags dropped)."""
    out = ""
    for part in loc:
        if isinstance(part, str) and part in UNION_TAGS:
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "$"


#: Problems listed in one error; the rest are counted. A few MB of input can hold a
#: million bad values, and listing them all made a 200 MB error document.
MAX_LISTED_ERRORS = 100


def invalid_from(error: ValidationError, *, file: str, prefix: str = "") -> InvalidInput:
    """Pydantic's errors as one ``InvalidInput`` naming the file and first field."""
    problems = []
    count = error.error_count()
    for item in error.errors(include_url=False, include_input=False)[:MAX_LISTED_ERRORS]:
        path = loc_path(item["loc"])
        field = f"{prefix}.{path}" if prefix and path != "$" else (prefix or path)
        problem = str(item["msg"]).removeprefix("Value error, ")
        problems.append({"field": field, "problem": problem})
    first = problems[0]
    return InvalidInput(
        f"{file}: {first['field']}: {first['problem']}"
        + (f" (and {count - 1} more)" if count > 1 else ""),
        field=first["field"],
        file=file,
        errors=problems,
        error_count=count,
    )


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
