"""One registry mechanism for named, pluggable classes (policies, routers).

Names are lower kebab case and unique; an unknown name fails with the closest match (case
aside: ``FCFS`` suggests ``fcfs``, a name is never taken in another case) or, for the name of a
family of entries (a paper's policies), the family's members, and the list of valid names;
bad constructor settings fail naming the entry.

Classes from outside headway join on the first lookup, in every process that looks a name
up (the CLI, the gateway, Ray workers, vLLM's engine core), from two places:

- installed packages' entry points in the registry's group (``headway.policies``,
  ``headway.routers``): a module, imported so that its decorators register, or a class,
  registered under the entry point's name unless it registered itself;
- :data:`PLUGINS_ENV` (``HEADWAY_PLUGINS``): comma-separated module names or ``.py`` files,
  imported once per process.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import os
import sys
import warnings
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Generic, TypeVar

__all__ = ["PLUGINS_ENV", "PluginError", "Registry", "load_env_plugins"]

T = TypeVar("T")
C = TypeVar("C", bound=type[Any])

PLUGINS_ENV = "HEADWAY_PLUGINS"
"""Environment variable: comma-separated modules or ``.py`` files with policies or routers."""

_env_done: set[str] = set()


class PluginError(ImportError):
    """A module named in ``HEADWAY_PLUGINS`` could not be imported."""


def load_env_plugins() -> None:
    """Import each module or ``.py`` file named in ``HEADWAY_PLUGINS`` (once per process)."""
    for item in (x.strip() for x in os.environ.get(PLUGINS_ENV, "").split(",")):
        if not item or item in _env_done:
            continue
        _env_done.add(item)  # a failing one fails once, not on every lookup
        try:
            if item.endswith(".py"):
                _import_file(Path(item))
            else:
                importlib.import_module(item)
        except Exception as exc:
            raise PluginError(f"{PLUGINS_ENV}: cannot import {item!r}: {type(exc).__name__}: {exc}") from exc


def _import_file(path: Path) -> None:
    if not path.is_file():
        raise FileNotFoundError(f"no such file {str(path)!r} (from {Path.cwd()})")
    name = "headway_plugin_" + "".join(c if c.isalnum() else "_" for c in str(path.resolve()))
    if name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise


def _fold(name: str) -> str:
    """``name`` in lower case without separators, to compare what users type with family names."""
    return "".join(c for c in name.lower() if c.isalnum())


def _check_settings(kind: str, name: str, cls: type, kwargs: Mapping[str, Any]) -> None:
    """Unknown keyword settings, named with the valid ones (and a close match), before ``cls`` runs.

    An ``__init__`` that takes ``**kwargs`` is taken to pass them to its base class's (the
    tenant policies pass the estimator's settings on); the settings are those of the chain
    up to the first ``__init__`` without ``**kwargs``. A class with no ``__init__`` of its own
    takes none; a chain of ``**kwargs`` up to ``object`` (a user's class that reads them
    itself) is not checked."""
    valid: list[str] = []
    forwards = False
    for klass in cls.__mro__[:-1]:  # not object's
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        try:
            params = inspect.signature(init).parameters
        except (TypeError, ValueError):  # no signature to read: the call itself will say
            return
        valid += [k for k, p in params.items() if k != "self" and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
        forwards = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        if not forwards:
            break
    if forwards:
        return
    unknown = [k for k in kwargs if k not in valid]
    if not unknown:
        return
    close = difflib.get_close_matches(unknown[0], valid, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    takes = f"its settings: {', '.join(valid)}" if valid else "it takes no settings"
    raise ValueError(f"{kind} {name!r} has no setting {unknown[0]!r}{hint}; {takes}")


def _redefines(cls: type, known: type) -> bool:
    """Whether ``cls`` is a new definition of ``known``: the same module and qualified name."""
    return (cls.__module__, cls.__qualname__) == (known.__module__, known.__qualname__)


class Registry(Generic[T]):
    """Classes of one kind registered by name with a class decorator."""

    def __init__(
        self,
        kind: str,
        plural: str,
        unknown: type[ValueError],
        load: Callable[[], None] | None = None,
        *,
        base: type[Any] = object,
        families: Mapping[str, tuple[str, ...]] | None = None,
        check: Callable[[Any, str], None] | None = None,
    ) -> None:
        self.kind = kind
        self.plural = plural
        self._unknown = unknown
        self._builtin = load  # imports the built-in modules, which register themselves
        self._base = base
        self._families = dict(families or {})
        """Names a user may type for a group of entries (a paper: ``"DriftSched"``) -> its members."""
        self._check = check
        """Called with each class and its name as it registers; raises for a class that cannot work."""
        self._classes: dict[str, type[T]] = {}
        self._entry_points_done = False

    @property
    def entry_point_group(self) -> str:
        """Where installed packages declare their classes of this kind (``headway.policies``)."""
        return f"headway.{self.plural}"

    def _load(self) -> None:
        if self._builtin is not None:
            self._builtin()
        if not self._entry_points_done:
            self._entry_points_done = True
            self._load_entry_points()
        load_env_plugins()

    def _load_entry_points(self) -> None:
        for ep in entry_points(group=self.entry_point_group):
            try:
                obj = ep.load()
                if isinstance(obj, type) and issubclass(obj, self._base) and obj not in self._classes.values():
                    self.register(ep.name)(obj)
            except Exception as exc:  # one broken package must not take every command down
                warnings.warn(
                    f"{self.kind} plugin {ep.name!r} ({ep.value}) failed to load: {type(exc).__name__}: {exc}",
                    RuntimeWarning,
                    stacklevel=3,
                )

    def register(self, name: str) -> Callable[[C], C]:
        """Class decorator: register a class under ``name`` and set its ``name`` attribute.

        A name taken by another class is a ValueError, unless that class is an earlier definition of
        this one (the same module and qualified name: a notebook cell run again, a module reloaded),
        which the new definition replaces."""
        if not name or name != name.lower() or " " in name or "_" in name:
            raise ValueError(f"{self.kind} names are lower kebab case, got {name!r}")

        def decorate(cls: C) -> C:
            if self._builtin is not None:  # first, so that taking a built-in's name fails here, not at its import
                self._builtin()
            known = self._classes.get(name)
            if known is not None and known is not cls and not _redefines(cls, known):
                raise ValueError(
                    f"{self.kind} name {name!r} is already registered by {known.__qualname__}: "
                    f"register {cls.__qualname__} under another name"
                )
            if self._check is not None:
                self._check(cls, name)
            cls.name = name
            self._classes[name] = cls
            return cls

        return decorate

    def unregister(self, name: str) -> None:
        """Remove ``name`` (for tests and plugins that register temporarily)."""
        del self._classes[name]

    def names(self) -> list[str]:
        """Every registered name, sorted."""
        self._load()
        return sorted(self._classes)

    def get(self, name: str) -> type[T]:
        """The class registered as ``name``; raises the registry's unknown-name error."""
        self._load()
        try:
            return self._classes[name]
        except KeyError:
            valid = ", ".join(sorted(self._classes))
            raise self._unknown(
                f"Unknown {self.kind} {name!r}.{self._hint(name)} Valid {self.plural}: {valid}"
            ) from None

    def _hint(self, name: str) -> str:
        """What an unknown ``name`` may have meant: a family's members when it names a family
        (``driftsched``, ``DriftSched``, ``drift-sched``), else the closest registered name, case
        aside (``FCFS``: ``fcfs``); ``""`` when nothing is close."""
        folded = _fold(name)
        for family, members in self._families.items():
            known = [m for m in members if m in self._classes]
            if _fold(family) != folded or not known:
                continue
            if folded in known:  # the family is named after one of its members (pars, uniboost)
                others = ", ".join(m for m in known if m != folded)
                return f" Did you mean {folded!r}?" + (f" The {family} family also has {others}." if others else "")
            return f" {family} is a family of {self.plural}: {', '.join(known)}."
        close = difflib.get_close_matches(name.lower(), self._classes, n=1)
        return f" Did you mean {close[0]!r}?" if close else ""

    def make(self, name: str, **kwargs: Any) -> T:
        """Instantiate the class registered as ``name`` with keyword settings; a setting the
        class does not take is a ValueError naming it and listing the ones it takes."""
        cls = self.get(name)
        _check_settings(self.kind, name, cls, kwargs)
        try:
            return cls(**kwargs)
        except TypeError as exc:
            raise ValueError(f"bad settings for {self.kind} {name!r}: {exc}") from None
