"""Resolving pack content from its source (R5): git at an exact commit, or a directory.

``official_repo`` content is read with the ``git`` executable at exactly the
full commit id the manifest names (abbreviations, branches and tags never get
this far: ``SourceRevision`` rejects them). One ``git cat-file --batch``
process per repository answers every pack of a release from that repository.
``local_path`` content is read from ``<dir>/pack.json``.

Every failure is an ``InvalidInput`` naming the manifest field (``packs[i]…``)
or the file and field inside ``pack.json``; nothing is written.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from domain.canonical import parse_json
from domain.content import PackContent, parse_pack_content
from domain.errors import InvalidInput, Unavailable
from domain.lifecycle import SourceFacts, SourceKind
from domain.manifest import LocalSource, Manifest, ManifestPack, OfficialSource, parse_manifest
from domain.matrix import Target

MAX_PACK_BYTES = 64 * 1024 * 1024
MAX_MANIFEST_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class ResolvedPack:
    """A manifest pack with its source facts and validated content."""

    index: int
    source: SourceFacts
    content: PackContent

    @property
    def name(self) -> str:
        return self.content.name

    @property
    def target(self) -> Target:
        return Target(
            category=self.content.category,
            source=self.source,
            payload_hash=self.content.payload_hash_v1,
            payload_hash_v0=self.content.payload_hash_v0,
        )


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


def load_manifest(path: Path) -> Manifest:
    data = read_input_file(path, field="manifest")
    return parse_manifest(parse_json(data, source=str(path)), file=str(path))


def resolve_manifest(path: Path) -> tuple[Manifest, list[ResolvedPack]]:
    """Parse the manifest and resolve every pack; all failures before any write."""
    manifest = load_manifest(path)
    return manifest, resolve_packs(manifest.packs, base=path.resolve().parent)


def resolve_packs(packs: Sequence[ManifestPack], *, base: Path) -> list[ResolvedPack]:
    by_repo: dict[Path, list[tuple[int, ManifestPack, OfficialSource]]] = {}
    resolved: dict[int, ResolvedPack] = {}
    for index, pack in enumerate(packs):
        if isinstance(pack.source, OfficialSource):
            repo = _repo_path(pack.source.repo, base, index)
            by_repo.setdefault(repo, []).append((index, pack, pack.source))
        else:
            resolved[index] = _resolve_local(index, pack, pack.source, base)
    for repo, items in by_repo.items():
        resolved.update(_resolve_official(repo, items))
    return [resolved[i] for i in range(len(packs))]


def _directory(path: Path, base: Path, field: str) -> tuple[Path, bool]:
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


def _repo_path(text: str, base: Path, index: int) -> Path:
    field = f"packs[{index}].source.repo"
    path = Path(text)
    if "://" in text:
        try:
            parsed = urlparse(text)
        except ValueError as exc:
            raise InvalidInput(f"{field}: not a valid URL: {exc}", field=field) from None
        if parsed.scheme != "file" or parsed.netloc not in ("", "localhost"):
            raise InvalidInput(
                f"{field}: only local repositories (a path or a file:// URL) are supported",
                field=field,
            )
        path = Path(unquote(parsed.path))
    path, is_dir = _directory(path, base, field)
    if not is_dir:
        raise InvalidInput(f"{field}: repository {path} does not exist", field=field)
    return path


def _git() -> str:
    git = shutil.which("git")
    if git is None:
        raise Unavailable("the git executable is not installed; it is needed for official_repo")
    return git


def _resolve_official(
    repo: Path, items: list[tuple[int, ManifestPack, OfficialSource]]
) -> dict[int, ResolvedPack]:
    """Read every (commit, path) of one repository through one ``git cat-file --batch``."""
    queries: list[str] = []
    for _, _, source in items:
        queries.append(source.revision)
        queries.append(f"{source.revision}:{source.path}")
    answers = _cat_file_batch(repo, queries, first_field=f"packs[{items[0][0]}].source.repo")
    out: dict[int, ResolvedPack] = {}
    for n, (index, pack, source) in enumerate(items):
        commit_type, _ = answers[2 * n]
        if commit_type != "commit":
            raise InvalidInput(
                f"packs[{index}].source.revision: {source.revision} is not a commit in {repo}"
                + (f" (it is a {commit_type})" if commit_type != "missing" else ""),
                field=f"packs[{index}].source.revision",
            )
        blob_type, content = answers[2 * n + 1]
        if blob_type != "blob":
            raise InvalidInput(
                f"packs[{index}].source.path: {source.path} is not a file at commit "
                f"{source.revision}",
                field=f"packs[{index}].source.path",
            )
        file = f"{repo}@{source.revision}:{source.path}"
        out[index] = ResolvedPack(
            index=index,
            source=SourceFacts(SourceKind.OFFICIAL_REPO, str(repo), source.revision, source.path),
            content=parse_pack_content(
                parse_json(content, source=file), file=file, expected_name=pack.name
            ),
        )
    return out


def _cat_file_batch(repo: Path, queries: list[str], *, first_field: str) -> list[tuple[str, bytes]]:
    env = dict(os.environ, GIT_TERMINAL_PROMPT="0", GIT_OPTIONAL_LOCKS="0")
    # NUL-terminated queries (-z): no byte of a query can end it early, and queries
    # holding a control character never get here (the manifest rejects them), so no
    # input can shift git's answers onto another query (R5).
    if any(c < " " or c == "\x7f" for q in queries for c in q):
        raise InvalidInput(
            f"{first_field}: a git query holds a control character", field=first_field
        )
    stdin = "".join(q + "\0" for q in queries).encode()
    try:
        proc = subprocess.run(
            [_git(), "-c", "safe.directory=*", "-C", str(repo), "cat-file", "--batch", "-z"],
            input=stdin,
            capture_output=True,
            env=env,
            timeout=600,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Unavailable(f"git could not read {repo}: {exc}") from None
    if proc.returncode != 0:
        message = proc.stderr.decode("utf-8", "replace").strip()
        raise InvalidInput(
            f"{first_field}: {repo} is not a readable git repository: {message}",
            field=first_field,
        )
    out: list[tuple[str, bytes]] = []
    data = proc.stdout
    pos = 0
    for _ in queries:
        end = data.index(b"\n", pos)
        header = data[pos:end].decode("utf-8", "replace").split()
        pos = end + 1
        if len(header) >= 2 and header[-1] == "missing":
            out.append(("missing", b""))
            continue
        if len(header) >= 2 and header[-1] == "ambiguous":
            out.append(("ambiguous", b""))
            continue
        kind, size = header[1], int(header[2])
        body = data[pos : pos + size]
        pos += size + 1
        out.append(("too-large", b"") if size > MAX_PACK_BYTES else (kind, body))
    return out


def _resolve_local(index: int, pack: ManifestPack, source: LocalSource, base: Path) -> ResolvedPack:
    field = f"packs[{index}].source.path"
    folder, is_dir = _directory(Path(source.path), base, field)
    if not is_dir:
        raise InvalidInput(f"{field}: directory {folder} does not exist", field=field)
    file = folder / "pack.json"
    data = read_input_file(file, field=field, limit=MAX_PACK_BYTES)
    return ResolvedPack(
        index=index,
        source=SourceFacts(SourceKind.LOCAL_PATH, str(folder), None, "pack.json"),
        content=parse_pack_content(
            parse_json(data, source=str(file)), file=str(file), expected_name=pack.name
        ),
    )
