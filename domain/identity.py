"""Typed identities (R1) and composite keys (R2).

An identity is an opaque string of 1-255 UTF-8 bytes with no leading or
trailing whitespace and no control characters. It is compared, sorted, hashed
and stored bytewise: never case-folded, trimmed or Unicode-normalized, so NFC
and NFD spellings are different identities. Python compares ``str`` by code
point, and UTF-8 preserves code-point order, so ``sorted()`` over identities
is exactly the bytewise order a ``VARBINARY`` column gives in SQL (R3).

Non-canonical input is rejected with the field named; it is never repaired.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import ClassVar, NamedTuple, Self

from domain.errors import InvalidInput

MAX_IDENTITY_BYTES = 255


def identity_problem(value: object, *, max_bytes: int = MAX_IDENTITY_BYTES) -> str | None:
    """Why ``value`` is not a canonical identity, or ``None`` when it is."""
    if not isinstance(value, str):
        return f"must be a string, got {type(value).__name__}"
    try:
        encoded = value.encode("utf-8")
    except UnicodeEncodeError:
        return "must be valid UTF-8 (lone surrogates are not allowed)"
    if not encoded:
        return "must not be empty"
    if len(encoded) > max_bytes:
        return f"must be at most {max_bytes} bytes of UTF-8, got {len(encoded)}"
    if value[0].isspace() or value[-1].isspace():
        return "must not have leading or trailing whitespace"
    control = _CONTROL.search(value)
    if control is not None:
        index = control.start()
        return f"must not contain control characters (U+{ord(value[index]):04X} at {index})"
    return None


#: Unicode's general category Cc, which is closed: exactly C0, DEL and C1. One regex
#: search instead of a ``unicodedata.category`` call per character (an identity is
#: checked wherever one enters, so this runs for every key of every manifest).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


class Identity(str):
    """Base of every typed identity; construction validates R1."""

    __slots__ = ()
    #: The field name used in errors when the caller does not name one.
    field: ClassVar[str] = "identity"

    def __new__(cls, value: object, *, field: str | None = None) -> Self:
        if type(value) is cls:
            return value
        problem = cls.problem(value)
        if problem is not None:
            name = field or cls.field
            raise InvalidInput(f"{name} {problem}", field=name, value=_preview(value), rule="R1")
        return super().__new__(cls, value)

    @classmethod
    def problem(cls, value: object) -> str | None:
        """Subclasses add rules; the base rule is R1's canonical form."""
        return identity_problem(value)

    @classmethod
    def trusted(cls, value: str) -> Self:
        """Wrap a value read back from the log, where it was validated on write."""
        return super().__new__(cls, value)


def _preview(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class PackName(Identity):
    __slots__ = ()
    field = "pack"


class InstallId(Identity):
    __slots__ = ()
    field = "install_id"


class ComponentKind(Identity):
    __slots__ = ()
    field = "kind"


class BusinessKey(Identity):
    __slots__ = ()
    field = "key"


class CredentialSet(Identity):
    __slots__ = ()
    field = "credential_set"


class WorkloadId(Identity):
    """The id of an ``integration:`` audience."""

    __slots__ = ()
    field = "workload_id"


class AppId(Identity):
    """The installation id of an ``app:`` audience."""

    __slots__ = ()
    field = "app_id"


class CommandId(Identity):
    __slots__ = ()
    field = "command_id"


class Category(Identity):
    __slots__ = ()
    field = "category"


_FULL_COMMIT = re.compile(r"[0-9a-f]{40}")


class SourceRevision(Identity):
    """A full 40-hex git commit id; abbreviations, branches and tags are rejected."""

    __slots__ = ()
    field = "revision"

    @classmethod
    def problem(cls, value: object) -> str | None:
        base = identity_problem(value)
        if base is not None:
            return base
        assert isinstance(value, str)
        if not _FULL_COMMIT.fullmatch(value):
            return "must be a full 40-character lowercase hex commit id"
        return None


class AudienceKind(StrEnum):
    """A str enum, so audiences sort bytewise as (kind, id) tuples."""

    APP = "app"
    INTEGRATION = "integration"


class Audience(NamedTuple):
    """A runtime consumer as a typed pair (R2), written ``kind:id`` at the edge."""

    kind: AudienceKind
    id: Identity

    @classmethod
    def parse(cls, text: object, *, field: str = "audience") -> Audience:
        if not isinstance(text, str):
            raise InvalidInput(f"{field} must be a string", field=field, rule="R1")
        kind_text, sep, ident = text.partition(":")
        if not sep:
            raise InvalidInput(
                f"{field} must be written app:<id> or integration:<id>",
                field=field,
                part="kind",
                value=_preview(text),
            )
        try:
            kind = AudienceKind(kind_text)
        except ValueError:
            raise InvalidInput(
                f"{field} kind must be 'app' or 'integration', got {kind_text!r}",
                field=field,
                part="kind",
                value=_preview(kind_text),
            ) from None
        id_class: type[Identity] = AppId if kind is AudienceKind.APP else WorkloadId
        return cls(kind, id_class(ident, field=f"{field}.id"))

    @classmethod
    def of(cls, kind: str, ident: str, *, field: str = "audience") -> Audience:
        """From the two parts given separately (e.g. two URL path segments).

        A ':' in the kind is rejected here: joining and re-splitting would move it
        into the id (R2), serving ("app:x", "y") as app:"x:y".
        """
        if ":" in kind:
            raise InvalidInput(
                f"{field} kind must be 'app' or 'integration', got {kind!r}",
                field=field,
                part="kind",
                value=_preview(kind),
            )
        return cls.parse(f"{kind}:{ident}", field=field)

    def __str__(self) -> str:
        return f"{self.kind.value}:{self.id}"

    @property
    def text(self) -> str:
        return str(self)


class ComponentRef(NamedTuple):
    """A component by typed coordinates (R2): pack, kind, business key."""

    pack: PackName
    kind: ComponentKind
    key: BusinessKey
