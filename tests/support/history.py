"""Synthetic but valid lifecycle histories in bulk (for projection tests and benchmarks).

Uses the real domain aggregates and the real application/recorder, so every
event is exactly what the command service would append; it only skips the
per-command preflight and lease, which are irrelevant for volume.
"""

from __future__ import annotations

from eventsourcing.domain import Aggregate

from domain.canonical import canonical_bytes
from domain.digests import Purpose, digest
from domain.lifecycle import (
    Generation,
    Origin,
    PackActivation,
    PackHistory,
    SourceFacts,
    SourceKind,
    install_id_for,
)
from ledger.store.runtime import Ledger


def _components(pack: str, version: int, count: int) -> list[dict[str, object]]:
    return [
        {
            "kind": "push_contract",
            "key": f"{pack}.c{n}",
            "payload": {"v": version, "n": n, "topic": f"{pack}-{n}"},
            "requires": [],
            "credential_sets": None,
        }
        for n in range(count)
    ]


def bulk_history(
    ledger: Ledger,
    *,
    packs: int,
    rounds: int,
    components: int = 2,
    fail_every: int = 0,
    batch_events: int = 2000,
) -> int:
    """Install ``packs`` packs, then advance each ``rounds - 1`` times; returns events.

    With ``fail_every``, every n-th advance fails clean instead of activating.
    """
    pending: dict[int, Aggregate] = {}
    total = 0
    activations: dict[str, PackActivation] = {}
    histories: dict[str, PackHistory] = {}
    current: dict[str, Generation] = {}
    per_aggregate = max(1, batch_events // 4)

    def flush() -> None:
        nonlocal total
        if pending:
            total += len(ledger.app.save(*pending.values()))
            pending.clear()

    for round_no in range(rounds):
        for n in range(packs):
            pack = f"pack-{n:06d}"
            revision = f"{round_no:08x}{n:032x}"
            components_json = _components(pack, round_no, components)
            payload_hash = (
                "v1:" + digest(Purpose.PAYLOAD_V1, canonical_bytes(components_json)).hex()
            )
            history = histories.get(pack)
            ordinal = (len(history.attempts) if history else 0) + 1
            install_id = install_id_for(pack, revision, payload_hash, ordinal)
            source = SourceFacts(
                SourceKind.OFFICIAL_REPO, "/repos/bulk", revision, f"{pack}/pack.json"
            )
            previous = current.get(pack)
            generation = Generation(
                pack=pack,
                install_id=install_id,
                ordinal=ordinal,
                origin=(Origin.ADVANCE if previous else Origin.INSTALL).value,
                category="app",
                source=source.to_json(),
                payload_hash=payload_hash,
                components=components_json,
                from_install_id=previous.install_id if previous else None,
            )
            if history is None:
                history = PackHistory(pack=pack, install_id=install_id, origin="install")
                histories[pack] = history
            else:
                history.attempt(install_id=install_id, origin="advance")
            touched: list[Aggregate] = [generation, history]
            if fail_every and previous is not None and (round_no * packs + n) % fail_every == 0:
                generation.fail(dirty=False, reason="synthetic failure")
            elif previous is None:
                generation.activate(epoch=1)
                activation = PackActivation.start(generation)
                activations[pack] = activation
                current[pack] = generation
                touched.append(activation)
            else:
                activation = activations[pack]
                generation.activate(epoch=activation.epoch + 1)
                activation.advance(generation)
                previous.retire(successor_install_id=install_id, epoch=activation.epoch)
                current[pack] = generation
                touched.extend([activation, previous])
            for aggregate in touched:
                pending[id(aggregate)] = aggregate
            if len(pending) >= per_aggregate:
                flush()
        # An aggregate touched again next round must not have its events grouped
        # with this round's: that would reorder events across aggregates.
        flush()
    return total
