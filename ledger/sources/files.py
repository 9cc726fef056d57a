"""Operator-supplied files and directories: read with a typed error for every failure
(R5). ``local_path`` pack content is read from ``<dir>/pack.json``."""

from __future__ import annotations

import hashlib
from pathlib import Path

from domain.canonical import parse_json
from domain.content import PackContent, parse_pack_content
from domain.errors import InvalidInput
from domain.lifecycle import SourceFacts, SourceKind
from domain.manifest import LocalSource, ManifestPack

MAX_PACK_BYTES = 64 * 1024 * 1024
MAX_MANIFEST_BYTES = 64 * 1024 * 1024


def read_input_file(path: Path, *, field: str, limit: int = MAX_MANIFEST_BYTES) -> bytes:
    """Read an operator-supplied file with a typed error for every failure."""
    try:
        with path.open("rb") as handle:
            data = handle.read(limit + 1)
    except FileNotFoundError:
        raise InvalidInput(f"{path} does not exist", field=field, path=str(path)) from None
    except IsADirectoryError:
        raise InvalidInput(f"{path} is a directory, not a file", field=field) from None
    except OSError as exc:
        raise InvalidInput(f"{path} cannot be read: {exc.strerror}", field=field) from None
    if len(data) > limit:
        raise InvalidInput(f"{path} is larger than {limit} bytes", field=field)
    return data


def directory(path: Path, base: Path, field: str) -> tuple[Path, bool]:
    """``path`` made absolute (``~`` expanded, relative to ``base``); is it a directory?

    Every way a hostile path can fail (an unknown ``~user``, a name too long for
    the file system) becomes ``InvalidInput`` naming ``field``.
    """
    try:
        path = path.expanduser()
        path = (path if path.is_absolute() else base / path).resolve()
        return path, path.is_dir()
    except (OSError, RuntimeError) as exc:
        raise InvalidInput(
            f"{field}: {str(path)[:200]!r} is not usable: {exc}", field=field
        ) from None


def _local_file(index: int, source: LocalSource, base: Path) -> tuple[SourceFacts, Path, bytes]:
    """The facts, path and raw bytes of a ``local_path`` pack's ``<dir>/pack.json``."""
    field = f"packs[{index}].source.path"
    folder, is_dir = directory(Path(source.path), base, field)
    if not is_dir:
        raise InvalidInput(f"{field}: directory {folder} does not exist", field=field)
    file = folder / "pack.json"
    data = read_input_file(file, field=field, limit=MAX_PACK_BYTES)
    return SourceFacts(SourceKind.LOCAL_PATH, str(folder), None, "pack.json"), file, data


def file_digest(data: bytes) -> str:
    """The digest a ``local_pack`` event records of its raw ``pack.json``: SHA-256 hex of
    the bytes exactly as read (R30; no parsing, no normalisation, no mtime)."""
    return hashlib.sha256(data).hexdigest()


def read_local(
    index: int, pack: ManifestPack, source: LocalSource, base: Path
) -> tuple[SourceFacts, PackContent, str]:
    """The content of a ``local_path`` pack, from ``<dir>/pack.json``, and the digest of
    the raw file it was parsed from (``file_digest``)."""
    facts, file, data = _local_file(index, source, base)
    content = parse_pack_content(
        parse_json(data, source=str(file)), file=str(file), expected_name=pack.name
    )
    return facts, content, file_digest(data)


def local_file_digest(
    index: int, pack: ManifestPack, source: LocalSource, base: Path
) -> tuple[SourceFacts, str]:
    """The source facts and raw-file digest of a ``local_path`` pack, without parsing it:
    the cheap check of whether its ``pack.json`` changed since the log recorded it (R30).
    A missing directory or file is the same ``InvalidInput`` as ``read_local``'s."""
    del pack  # the name is checked only when the file is parsed
    facts, _, data = _local_file(index, source, base)
    return facts, file_digest(data)
