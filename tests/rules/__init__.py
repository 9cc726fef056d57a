"""One rule's proofs on a real store (SQLite file and MariaDB)."""
