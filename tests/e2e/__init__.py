"""End to end through the CLI, HTTP and the Python API, and the examples."""
