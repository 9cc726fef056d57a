"""``domain.json_diff``: the changes ``diff`` shows inside a changed fact — pure."""

from __future__ import annotations

from domain.json_diff import json_changes


def test_r17_json_changes_name_each_changed_path() -> None:
    assert json_changes({"a": 1}, {"a": 1}) == []
    assert json_changes({"a": {"b/c": 1, "d": True}}, {"a": {"b/c": 2, "d": 1, "e": None}}) == [
        {"path": "/a/b~1c", "op": "replace", "from": 1, "to": 2},
        {"path": "/a/d", "op": "replace", "from": True, "to": 1},
        {"path": "/a/e", "op": "add", "to": None},
    ]
    assert json_changes([1, 2], [1, 3]) == [{"path": "/1", "op": "replace", "from": 2, "to": 3}]
    assert json_changes([1], [1, 2]) == [{"path": "", "op": "replace", "from": [1], "to": [1, 2]}]
    assert json_changes({"~": 1}, {}) == [{"path": "/~0", "op": "remove", "from": 1}]
