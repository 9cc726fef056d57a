"""Harnesses shared by the tests: git repositories, CLI runners, clusters, proxies,
subprocess workers and reference implementations (no fakes of the database)."""
