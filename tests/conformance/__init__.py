"""Conformance: vectors, golden stores, schema artifacts, the eventsourcing contract."""
