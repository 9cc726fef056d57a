"""Whether a log's current tree resumes where its witnesses left it (R29, issue 28 item 7).

A witness keeps the last (size, root) it cosigned for an origin and cosigns a new
checkpoint of that origin only if it is not smaller and a consistency proof from the old
tree verifies. ``check_resume`` applies exactly that rule to a store's checkpoint against
a cosigned one (the one an export carried, or a witness's), so an operator learns before
signing anything whether a restored store continues its log or must start a new origin.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

from domain import merkle
from domain.errors import IntegrityFailure, Stale
from domain.notes import Checkpoint


def check_resume(cosigned: Checkpoint, current: Checkpoint, proof: Sequence[bytes]) -> None:
    """Nothing when ``current`` extends ``cosigned`` (``proof``: the RFC 9162 consistency
    proof from ``cosigned.size`` to ``current.size``), else: INTEGRITY ``wrong_origin``
    (another log), STALE axis ``checkpoint`` (a smaller tree: a rollback, which every
    witness and client refuses), INTEGRITY ``inconsistent_tree`` (a fork: the same size
    with another root, or a larger tree that does not extend the cosigned one)."""
    if current.origin != cosigned.origin:
        raise IntegrityFailure(
            f"the checkpoint is of {current.origin!r}, the cosigned one of {cosigned.origin!r}",
            reason="wrong_origin",
        )
    if current.size < cosigned.size:
        raise Stale(
            f"the log has {current.size} entries and its witnesses cosigned {cosigned.size}: "
            "a rollback, which witnesses and clients refuse; restore a backup that holds the "
            "cosigned size, or start a new origin that clients re-pin",
            axis="checkpoint",
            required=cosigned.size,
            served=current.size,
            reason="rollback",
        )
    if current.size == cosigned.size:
        if current.root != cosigned.root:
            raise IntegrityFailure(
                f"the log at size {current.size} has another root than the cosigned one: a "
                "fork, which witnesses refuse",
                reason="inconsistent_tree",
            )
        return
    if cosigned.size == 0:
        return
    try:
        merkle.verify_consistency(
            cosigned.size, current.size, list(proof), cosigned.root, current.root
        )
    except IntegrityFailure:
        raise IntegrityFailure(
            f"the log at size {current.size} does not extend the cosigned tree of size "
            f"{cosigned.size}: a fork (new history over a lost one), which witnesses refuse",
            reason="inconsistent_tree",
        ) from None
