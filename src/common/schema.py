"""What every config section shares: the one-line error, choice checks, and the registry of an axis's kinds.

An axis with kinds (precision by its method, task by its kind, engine, tracking) keeps each kind's config
class in a `Kinds` registry: the class holds only that kind's fields, validates them and carries that
kind's checks, and it registers itself once; the choice list users see is the registry's keys.
"""

from __future__ import annotations

import dataclasses
from typing import Any


class ConfigError(ValueError):
    """A setting a user can fix: the message is the one line they see."""


def check_range(where: str, value: float, low: float, high: float, why: str = "") -> None:
    """`value` within [low, high], or one line saying so (`why`: what holds the upper bound, e.g. the C long a
    setrlimit takes): a count or size past what its user can hold had overflowed, or run without end, after the
    job had started."""
    if not low <= value <= high:
        raise ConfigError(f"{where}={value} must be from {low} to {high}" + (f" ({why})" if why else ""))


def check_choice(where: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{where}={value!r} is not one of: {', '.join(allowed)}")


class Kinds:
    """One axis's kinds: the value of `selector` (e.g. task.kind) -> the config class of that kind.

    TASKS = Kinds("task", "kind")
    @TASKS.register
    @dataclass(frozen=True, kw_only=True)
    class Perplexity(TaskConfig):
        KIND: ClassVar[str] = "perplexity"
        window: int = 512
    """

    def __init__(self, axis: str, selector: str):
        self.axis, self.selector = axis, selector
        self._classes: dict[str, type] = {}

    def register(self, cls: type) -> type:
        kind = cls.KIND
        if kind in self._classes:
            raise ValueError(f"{self.axis} kind {kind!r} is registered twice")
        self._classes[kind] = cls
        return cls

    def items(self) -> list[tuple[str, type]]:
        """(kind, config class), in the order they registered."""
        return list(self._classes.items())

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._classes)

    def get(self, kind: str) -> type | None:
        return self._classes.get(kind)

    def owners(self, field: str) -> tuple[str, ...]:
        """The kinds whose config has this field."""
        return tuple(k for k, cls in self._classes.items() if field in {f.name for f in dataclasses.fields(cls)})

    def __getitem__(self, kind: str) -> type:
        check_choice(f"{self.axis}.{self.selector}", kind, self.names)
        return self._classes[kind]

    def field_names(self) -> set[str]:
        """Every kind's fields: the keys the axis's YAML may hold (conf/<axis>/_fields.yaml lists them all so
        one override reaches every job of a sweep that has it)."""
        return {f.name for cls in self._classes.values() for f in dataclasses.fields(cls)}
