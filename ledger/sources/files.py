"""Operator-supplied files and directories: read with a typed error for every failure
(R5). ``local_path`` pack content is read from ``<dir>/pack.json``."""

from __future__ import annotations

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


def read_local(
    index: int, pack: ManifestPack, source: LocalSource, base: Path
) -> tuple[SourceFacts, PackContent]:
    """The content of a ``local_path`` pack, from ``<dir>/pack.json``."""
    field = f"packs[{index}].source.path"
    folder, is_dir = directory(Path(source.path), base, field)
    if not is_dir:
        raise InvalidInput(f"{field}: directory {folder} does not exist", field=field)
    file = folder / "pack.json"
    data = read_input_file(file, field=field, limit=MAX_PACK_BYTES)
    return SourceFacts(SourceKind.LOCAL_PATH, str(folder), None, "pack.json"), parse_pack_content(
        parse_json(data, source=str(file)), file=str(file), expected_name=pack.name
    )
