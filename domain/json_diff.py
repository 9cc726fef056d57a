"""The difference between two JSON documents, as a list of changes at JSON Pointers — pure.

``revision diff`` shows a changed fact as the changes between its two documents
(payload, requires, credential sets), not as two whole payloads: an operator reads
``/payload/url: "https://a" → "https://b"``. Objects are compared key by key and
arrays of equal length element by element; anything else that differs (a scalar, a
type, an array that grew or shrank) is replaced whole, so every change is one line.
Paths are RFC 6901 JSON Pointers (``~`` as ``~0``, ``/`` as ``~1``); changes are in
path order, byte-wise, the same on every machine.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

#: ``add``: only the new document has the path; ``remove``: only the old one; ``replace``:
#: both, with other values.
ChangeOp = Literal["add", "remove", "replace"]

# ``from`` is a keyword: the functional form names the keys as the JSON shows them.
JsonChange = TypedDict(
    "JsonChange",
    {"path": str, "op": ChangeOp, "from": NotRequired[Any], "to": NotRequired[Any]},
)


def pointer_token(key: str) -> str:
    """One RFC 6901 reference token."""
    return key.replace("~", "~0").replace("/", "~1")


def json_changes(old: Any, new: Any, path: str = "") -> list[JsonChange]:
    """The changes that turn ``old`` into ``new`` (empty when they are equal)."""
    out: list[JsonChange] = []
    _walk(old, new, path, out)
    return out


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON: ``True`` is not ``1`` (Python's ``==`` says it is)."""
    if type(a) is not type(b):
        return False
    return bool(a == b)


def _walk(old: Any, new: Any, path: str, out: list[JsonChange]) -> None:
    if _same(old, new):
        return
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new), key=lambda k: str(k).encode()):
            here = f"{path}/{pointer_token(str(key))}"
            if key not in new:
                out.append({"path": here, "op": "remove", "from": old[key]})
            elif key not in old:
                out.append({"path": here, "op": "add", "to": new[key]})
            else:
                _walk(old[key], new[key], here, out)
        return
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for index, (a, b) in enumerate(zip(old, new, strict=True)):
            _walk(a, b, f"{path}/{index}", out)
        return
    out.append({"path": path, "op": "replace", "from": old, "to": new})
