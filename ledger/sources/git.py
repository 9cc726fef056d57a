"""``official_repo`` content, read with the ``git`` executable at exactly the full commit
id the manifest names (abbreviations, branches and tags never get this far:
``SourceRevision`` rejects them). One ``git cat-file --batch`` process per repository
answers every pack of a release from that repository (R5)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from urllib.parse import unquote, urlparse

from domain.canonical import parse_json
from domain.content import PackContent, parse_pack_content
from domain.errors import InvalidInput, Unavailable
from domain.lifecycle import SourceFacts, SourceKind
from domain.manifest import ManifestPack, OfficialSource
from ledger.sources.files import MAX_PACK_BYTES, directory


def repo_path(text: str, base: Path, index: int) -> Path:
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
    path, is_dir = directory(path, base, field)
    if not is_dir:
        raise InvalidInput(f"{field}: repository {path} does not exist", field=field)
    return path


def _git() -> str:
    git = shutil.which("git")
    if git is None:
        raise Unavailable("the git executable is not installed; it is needed for official_repo")
    return git


def read_official(
    repo: Path, items: list[tuple[int, ManifestPack, OfficialSource]]
) -> dict[int, tuple[SourceFacts, PackContent]]:
    """Read every (commit, path) of one repository through one ``git cat-file --batch``."""
    queries: list[str] = []
    for _, _, source in items:
        queries.append(source.revision)
        queries.append(f"{source.revision}:{source.path}")
    answers = _cat_file_batch(repo, queries, first_field=f"packs[{items[0][0]}].source.repo")
    out: dict[int, tuple[SourceFacts, PackContent]] = {}
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
        out[index] = (
            SourceFacts(SourceKind.OFFICIAL_REPO, str(repo), source.revision, source.path),
            parse_pack_content(
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
