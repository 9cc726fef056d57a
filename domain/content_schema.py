"""The input schema of ``pack.json`` (pydantic): field rules and error reporting.

``domain.content.parse_pack_content`` validates with it, and ``domain.manifest`` builds
the release manifest's schema from its pieces. It is a module of its own so that only
the commands that validate input import pydantic; reading a store never does (issue
25.7).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from domain.errors import InvalidInput
from domain.identity import BusinessKey, Category, ComponentKind, CredentialSet, Identity, PackName


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
