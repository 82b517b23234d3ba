"""Command-line help shared by headway's subcommands."""

from __future__ import annotations

import argparse

__all__ = ["HelpFormatter"]


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends ``(default: X)`` to an option's help only where it adds something: not when the
    default is unset, ``False`` or empty (an optional value, a flag, a repeatable option), nor
    when the help already states its default."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if default is None or default is False or default in ("", [], ()) or "default" in text.lower():
            return text
        return super()._get_help_string(action)
