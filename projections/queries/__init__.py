"""The read model's queries over the live view tables, one module per consumer:
``status`` (status, recovery, the running-view check every query starts with) and
``publication`` (the parent revision's content and the audience map, for publishing)."""
