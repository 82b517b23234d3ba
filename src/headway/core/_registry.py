"""One registry mechanism for named, pluggable classes (policies, routers).

Names are lower kebab case and unique; an unknown name fails with the closest match
and the list of valid names; bad constructor settings fail naming the entry.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["Registry"]

T = TypeVar("T")
C = TypeVar("C", bound=type[Any])


class Registry(Generic[T]):
    """Classes of one kind registered by name with a class decorator."""

    def __init__(
        self, kind: str, plural: str, unknown: type[ValueError], load: Callable[[], None] | None = None
    ) -> None:
        self.kind = kind
        self.plural = plural
        self._unknown = unknown
        self._load = load  # imports the built-in modules, which register themselves
        self._classes: dict[str, type[T]] = {}

    def register(self, name: str) -> Callable[[C], C]:
        """Class decorator: register a class under ``name`` and set its ``name`` attribute."""
        if not name or name != name.lower() or " " in name or "_" in name:
            raise ValueError(f"{self.kind} names are lower kebab case, got {name!r}")

        def decorate(cls: C) -> C:
            known = self._classes.get(name)
            if known is not None and known is not cls:
                raise ValueError(f"{self.kind} name {name!r} is already registered by {known.__qualname__}")
            cls.name = name
            self._classes[name] = cls
            return cls

        return decorate

    def unregister(self, name: str) -> None:
        """Remove ``name`` (for tests and plugins that register temporarily)."""
        del self._classes[name]

    def names(self) -> list[str]:
        """Every registered name, sorted."""
        if self._load is not None:
            self._load()
        return sorted(self._classes)

    def get(self, name: str) -> type[T]:
        """The class registered as ``name``; raises the registry's unknown-name error."""
        if self._load is not None:
            self._load()
        try:
            return self._classes[name]
        except KeyError:
            close = difflib.get_close_matches(name, self._classes, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise self._unknown(
                f"Unknown {self.kind} {name!r}.{hint} Valid {self.plural}: {', '.join(sorted(self._classes))}"
            ) from None

    def make(self, name: str, **kwargs: Any) -> T:
        """Instantiate the class registered as ``name`` with keyword settings."""
        cls = self.get(name)
        try:
            return cls(**kwargs)
        except TypeError as exc:
            raise ValueError(f"bad settings for {self.kind} {name!r}: {exc}") from None
