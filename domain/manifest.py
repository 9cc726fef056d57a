"""The release manifest (what ``catalog-ledger apply`` converges to), validated.

Paths are relative to the manifest file. Sources are either
``official_repo`` (a git repository + full 40-hex commit id + path of
``pack.json`` inside it) or ``local_path`` (a directory holding ``pack.json``).
Audiences are parsed into typed pairs at this edge (R2). ``remove`` lists
installed packs the release removes (R7); a name may not also be under
``packs``, nor be listed twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, RootModel, ValidationError

from domain.content_schema import (
    CategoryText,
    CredentialText,
    FirstError,
    KeyText,
    KindText,
    PackText,
    StrictModel,
    identity_check,
    invalid_from,
)
from domain.errors import InvalidInput
from domain.identity import (
    Audience,
    BusinessKey,
    ComponentKind,
    CredentialSet,
    Identity,
    InstallId,
    PackName,
    SourceRevision,
)

RevisionText = Annotated[str, AfterValidator(identity_check(SourceRevision))]


def _control(value: str) -> str | None:
    """The first control character (C0, DEL or C1) in ``value``, if any."""
    return next((c for c in value if c < " " or "\x7f" <= c <= "\x9f"), None)


def _path_problem(value: str, *, inside_repo: bool) -> str | None:
    """Why ``value`` is not an acceptable source path (R5: it must name one file exactly)."""
    if not value:
        return "must be a non-empty path"
    bad = _control(value)
    if bad is not None:
        return f"must not contain control characters (found U+{ord(bad):04X})"
    if inside_repo:
        parts = value.split("/")
        if value.startswith("/") or any(p in ("", ".", "..") for p in parts):
            return "must be a relative path inside the repository without '.' or '..'"
    return None


def _path(inside_repo: bool) -> Any:
    def check(value: str) -> str:
        problem = _path_problem(value, inside_repo=inside_repo)
        if problem is not None:
            raise ValueError(problem)
        return value

    return AfterValidator(check)


class OfficialSourceModel(StrictModel):
    kind: Literal["official_repo"]
    repo: Annotated[str, _path(inside_repo=False)]
    revision: RevisionText
    path: Annotated[str, _path(inside_repo=True)] = "pack.json"


class LocalSourceModel(StrictModel):
    kind: Literal["local_path"]
    path: Annotated[str, _path(inside_repo=False)]


class ManifestPackModel(StrictModel):
    name: PackText
    source: Annotated[OfficialSourceModel | LocalSourceModel, Field(discriminator="kind")]


class BindingModel(StrictModel):
    audience: str
    pack: PackText
    kind: KindText
    key: KeyText
    credential_set: CredentialText | None = None


class ManifestModel(StrictModel):
    packs: Annotated[list[ManifestPackModel], FirstError] = Field(default_factory=list)
    #: Absent: keep the current bindings (re-bound to moved generations);
    #: present (even empty): exactly this set.
    bindings: Annotated[list[BindingModel], FirstError] | None = None
    #: Installed packs this release removes (R7), by name.
    remove: Annotated[list[PackText], FirstError] = Field(default_factory=list)


@dataclass(frozen=True)
class OfficialSource:
    repo: str
    revision: SourceRevision
    path: str


@dataclass(frozen=True)
class LocalSource:
    path: str


@dataclass(frozen=True)
class ManifestPack:
    name: PackName
    source: OfficialSource | LocalSource


@dataclass(frozen=True)
class BindingSpec:
    """One binding as the manifest asks for it (R14 binds it to a generation later)."""

    audience: Audience
    pack: PackName
    kind: ComponentKind
    key: BusinessKey
    credential_set: CredentialSet | None
    #: Where the binding stands in the user's manifest (for error paths); not identity.
    index: int = field(default=-1, compare=False)

    def sort_key(self) -> tuple[str, str, str, str, str, str]:
        """The binding's identity as a ``BindingRow.ident`` (built once per binding)."""
        key: tuple[str, str, str, str, str, str] | None = self.__dict__.get("_sort_key")
        if key is None:
            key = (
                self.audience.kind._value_,  # the member's value, without the descriptor
                self.audience.id,
                self.pack,
                self.kind,
                self.key,
                self.credential_set or "",
            )
            self.__dict__["_sort_key"] = key  # frozen: cached beside the fields
        return key


@dataclass(frozen=True)
class Manifest:
    packs: tuple[ManifestPack, ...]
    bindings: tuple[BindingSpec, ...] | None
    #: Packs to remove, in manifest order (the index is ``remove[i]`` in errors).
    remove: tuple[PackName, ...] = ()
    #: The manifest file, for error messages; not part of the release.
    file: str = field(default="", compare=False)


def parse_manifest(data: Any, *, file: str) -> Manifest:
    """Validate manifest data; errors name the file and the field."""
    try:
        model = ManifestModel.model_validate(data)
    except ValidationError as exc:
        raise invalid_from(exc, file=file) from None
    packs: list[ManifestPack] = []
    seen: dict[str, int] = {}
    for index, pack in enumerate(model.packs):
        if pack.name in seen:
            raise InvalidInput(
                f"{file}: packs[{index}].name: pack {pack.name!r} is listed twice "
                f"(first at packs[{seen[pack.name]}])",
                field=f"packs[{index}].name",
                file=file,
            )
        seen[pack.name] = index
        source: OfficialSource | LocalSource
        if isinstance(pack.source, OfficialSourceModel):
            source = OfficialSource(
                pack.source.repo, SourceRevision.trusted(pack.source.revision), pack.source.path
            )
        else:
            source = LocalSource(pack.source.path)
        packs.append(ManifestPack(PackName.trusted(pack.name), source))
    bindings: list[BindingSpec] = []
    seen_bindings: dict[BindingSpec, int] = {}
    for index, binding in enumerate(model.bindings or []):
        try:
            audience = Audience.parse(binding.audience, field=f"bindings[{index}].audience")
        except InvalidInput as exc:
            raise InvalidInput(
                f"{file}: {exc.message}",
                field=exc.field,
                file=file,
                **{k: v for k, v in exc.details.items() if k != "field"},
            ) from None
        spec = BindingSpec(
            audience=audience,
            pack=PackName.trusted(binding.pack),
            kind=ComponentKind.trusted(binding.kind),
            key=BusinessKey.trusted(binding.key),
            credential_set=CredentialSet.trusted(binding.credential_set)
            if binding.credential_set is not None
            else None,
            index=index,
        )
        if spec in seen_bindings:
            raise InvalidInput(
                f"{file}: bindings[{index}] repeats bindings[{seen_bindings[spec]}]",
                field=f"bindings[{index}]",
                file=file,
            )
        seen_bindings[spec] = index
        bindings.append(spec)
    specs = tuple(sorted(bindings, key=BindingSpec.sort_key))
    removed: dict[str, int] = {}
    for index, name in enumerate(model.remove):
        field = f"remove[{index}]"
        if name in seen:
            raise InvalidInput(
                f"{file}: {field}: pack {name!r} is also listed under packs[{seen[name]}]; "
                "a release either installs a pack or removes it",
                field=field,
                file=file,
            )
        if name in removed:
            raise InvalidInput(
                f"{file}: {field}: pack {name!r} is listed twice "
                f"(first at remove[{removed[name]}])",
                field=field,
                file=file,
            )
        removed[name] = index
    return Manifest(
        tuple(packs),
        specs if model.bindings is not None else None,
        tuple(PackName.trusted(name) for name in model.remove),
        file,
    )


# -- legacy `_System_InstalledPack` records -----------------------------------------------

IdentityText = Annotated[str, AfterValidator(identity_check(Identity))]
InstallIdText = Annotated[str, AfterValidator(identity_check(InstallId))]


class LegacySourceModel(StrictModel):
    kind: Literal["official_repo", "local_path"]
    repo: IdentityText | None = None
    revision: IdentityText | None = None
    path: IdentityText | None = None


class LegacyRecordModel(StrictModel):
    pack: PackText
    install_id: InstallIdText
    status: IdentityText
    category: CategoryText
    source: LegacySourceModel
    # Recorded as found: a missing or malformed hash is a fact about the legacy
    # table, and adoption fails closed on it (R7) rather than import refusing it.
    applied_payload_hash: Annotated[str, Field(max_length=255)] | None = None


class LegacyFileModel(RootModel[Annotated[list[LegacyRecordModel], FirstError]]):
    pass


def parse_legacy_records(data: Any, *, file: str) -> list[dict[str, Any]]:
    """Validate a legacy export; each record as the facts the log will hold."""
    try:
        model = LegacyFileModel.model_validate(data)
    except ValidationError as exc:
        raise invalid_from(exc, file=file) from None
    out: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for index, record in enumerate(model.root):
        if record.pack in seen:
            raise InvalidInput(
                f"{file}: [{index}].pack: pack {record.pack!r} appears twice "
                f"(first at [{seen[record.pack]}])",
                field=f"[{index}].pack",
                file=file,
            )
        seen[record.pack] = index
        source = {k: v for k, v in record.source.model_dump().items() if v is not None}
        out.append(
            {
                "pack": record.pack,
                "install_id": record.install_id,
                "status": record.status,
                "category": record.category,
                "source": source,
                "applied_payload_hash": record.applied_payload_hash,
            }
        )
    return out
