"""The README's results table quotes figures from the generated results pages; each must be on its page.

A result file rerun and its page regenerated (or a reproduction rerun) leaves the README's copy of the
old figure behind unless someone remembers it: every number in a link's text to ``docs/results/`` must
appear on the linked page, to the precision the README shows (0.424 on the page reads 0.42 in the
README), and the verdict counts quoted for each paper must be its page's.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

_NUMBER = re.compile(r"(?<![\d.])-?\d[\d,]*(?:\.\d+)?")
_LINK = re.compile(r"\[([^\]]*\d[^\]]*)\]\((docs/results/[^)#]+)(?:#[^)]*)?\)")


def numbers(text: str) -> list[str]:
    """The numbers in ``text`` as written (thousands separators dropped, a sign kept)."""
    return [m.group().replace(",", "") for m in _NUMBER.finditer(text)]


def missing_figures(label: str, page: str) -> list[str]:
    """The numbers of ``label`` that no number on ``page``, rounded to the label's decimals, equals."""
    on_page = [float(n) for n in numbers(page)]
    out = []
    for figure in numbers(label):
        decimals = len(figure.split(".")[1]) if "." in figure else 0
        value = float(figure)
        if not any(round(p, decimals) == value or round(-p, decimals) == value for p in on_page):
            out.append(figure)
    return out


QUOTES = [(m.group(1), m.group(2)) for m in _LINK.finditer(README.read_text(encoding="utf-8"))]


def test_the_readme_quotes_results() -> None:
    assert len(QUOTES) >= 15


@pytest.mark.parametrize(("label", "target"), QUOTES, ids=[f"{t}:{lab[:30]}" for lab, t in QUOTES])
def test_a_quoted_figure_is_on_its_page(label: str, target: str) -> None:
    page = ROOT / target
    assert page.is_file(), f"README links {target}, which does not exist"
    assert missing_figures(label, page.read_text(encoding="utf-8")) == [], (
        f"README quotes {label!r} from {target}, which does not show these figures (rerun and not updated?)"
    )


def test_the_check_catches_a_stale_figure() -> None:
    page = "| gateway+pars | x2.98 | 0.424 | 1,234 requests | -1.6% |"
    assert missing_figures("2.98x lower; 0.42; 1,234; -1.6 %", page) == []
    assert missing_figures("3.01x lower; 0.43; 1,235", page) == ["3.01", "0.43", "1235"]


_VERDICTS = re.compile(
    r"\[\w+\]\((docs/results/reproduce-[\w-]+\.md)\)\s+(\d+)(?:\s+reproduced)?,\s+(\d+)(?:\s+direction\s+only)?,"
    r"\s+(\d+)(?:\s+not)?\s+of\s+(\d+)"
)
_PAGE_VERDICTS = re.compile(
    r"^Verdicts: (\d+) reproduced, (\d+) direction only, (\d+) not reproduced, of (\d+) claims\.", re.M
)


def test_the_readme_counts_each_papers_verdicts_as_its_page_does() -> None:
    quoted = _VERDICTS.findall(README.read_text(encoding="utf-8"))
    assert len(quoted) == 3, "the README quotes the verdict counts of PARS, UniBoost and DriftSched"
    for target, *counts in quoted:
        found = _PAGE_VERDICTS.search((ROOT / target).read_text(encoding="utf-8"))
        assert found is not None, f"{target} has no 'Verdicts:' line"
        page = list(found.groups())
        assert page == counts, f"README quotes {counts} for {target}, the page says {page}"
