"""Engine-specific behaviour: identity and collation, locking, pools, DDL, clusters."""
