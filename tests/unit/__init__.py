"""Pure tests: no database, no subprocess engine."""
