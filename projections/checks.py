"""The R28 checks of a view row against the log, by name, with a test-only switch each.

Every read or write path that takes a value from a view checks it against what the
log committed first (R28). Each such check has a name here; ``DISABLED`` exists only
so that the view-tampering property test (``tests/rules/test_r28_view_tampering.py``, and
``tests/rules/test_r28_credential_view.py`` for ``CREDENTIAL``) can
turn one check off and show that the test then fails: proof that the check is needed
and the test bites. Production code never writes to it.
"""

from __future__ import annotations

#: Reader: the catalog view's head revision and content digest are the revision event's.
HEAD = "reader.head"
#: Reader: the audience's recorded digest is the one its audience view event committed,
#: and an audience the log publishes a view for has its rows.
AUDIENCE = "reader.audience"
#: Reader: each stored fact matches its fact digest.
FACT = "reader.fact"
#: Reader: the served rows give the audience digest the log committed.
DIGEST = "reader.digest"
#: Writers: a parent revision's content read from views or kept fragments gives the
#: digests and counts its revision event committed.
PARENT = "writer.parent"
#: Writers: the audience map's stored nodes reproduce the parent's root before use.
MAP = "writer.map"
#: Writers: an abandoned-attempt hint of the generation view is what the log says.
PREPARING = "writer.preparing"

#: Serving: a credential row authenticates no one until the log confirms it.
CREDENTIAL = "serve.credential"

#: The checks the view-tampering sweep covers (``CREDENTIAL`` has its own test).
ALL = (HEAD, AUDIENCE, FACT, DIGEST, PARENT, MAP, PREPARING)

#: Test-only: checks turned off (never written outside tests).
DISABLED: set[str] = set()


def on(name: str) -> bool:
    """Whether check ``name`` runs (always, outside the property test)."""
    return name not in DISABLED
