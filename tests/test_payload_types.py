"""The dataclasses Temporal decodes (activity and workflow inputs, results, signals,
queries) carry their annotations as objects, not strings.

The SDK calls ``typing.get_type_hints`` on a dataclass each time it decodes one. With
``from __future__ import annotations`` every field's hint is a string that is compiled and
evaluated again on every decode: a ``ReadInput`` took about 1 ms instead of 0.25 ms, and a
worker taking over a hundred streams at once decodes one per connection, on the same core
that starts them. So the modules that define these types do without that import.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from typing import Any

from durable_sse import activities, workflows


def _temporal_methods(cls: type) -> list[Any]:
    """Activity definitions, workflow run methods and signal, query and update handlers:
    the SDK marks each with an attribute named ``__temporal_...``."""
    return [
        member
        for _, member in inspect.getmembers(cls, inspect.isfunction)
        if any(attribute.startswith("__temporal_") for attribute in vars(member))
    ]


def _payload_types() -> set[type]:
    """Every dataclass reachable from the hints of a registered workflow or activity."""
    found: set[type] = set()

    def walk(hint: Any) -> None:
        for argument in typing.get_args(hint):
            walk(argument)
        if dataclasses.is_dataclass(hint) and isinstance(hint, type) and hint not in found:
            found.add(hint)
            for field_hint in typing.get_type_hints(hint).values():
                walk(field_hint)

    classes = [getattr(workflows, name) for name in workflows.__all__]
    classes += [getattr(activities, name) for name in activities.__all__]
    for cls in classes:
        for method in _temporal_methods(cls):
            for hint in typing.get_type_hints(method).values():
                walk(hint)
    return found


def test_the_walk_finds_the_read_activity_input_and_the_workflow_state() -> None:
    names = {cls.__name__ for cls in _payload_types()}
    assert {"ReadInput", "ReadResult", "StreamSpec", "StreamState", "ReplaySignal"} <= names


def test_no_payload_type_has_string_annotations() -> None:
    stringly = sorted(
        f"{cls.__module__}.{cls.__name__}"
        for cls in _payload_types()
        if any(isinstance(hint, str) for hint in vars(cls).get("__annotations__", {}).values())
    )
    assert stringly == []
