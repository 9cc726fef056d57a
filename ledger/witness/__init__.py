"""A C2SP transparency-log witness (R29): ``catalog-ledger witness``.

``state`` keeps the last cosigned tree per log and the evidence of refused forks in
the witness's own SQLite file; ``protocol`` answers tlog-witness ``add-checkpoint``;
``app`` serves it over HTTP; ``submit`` is the log side's client of any such witness.
The package imports the pure ``domain`` and ``ledger.observability`` only.
"""
