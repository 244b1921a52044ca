"""The docs' figures cite their data: every ``benchmarks/results/...`` file and every
image a page in docs/ names must be in the repository (a pattern with ``*`` or ``{a,b}``
must match at least one file), so a reader who follows a table to its JSON finds it."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs").glob("*.md"))
RESULT = re.compile(r"benchmarks/results/[A-Za-z0-9_.*{},-]+")
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")


def expand_braces(pattern: str) -> list[str]:
    """``a_{x,y}_b`` -> ``a_x_b``, ``a_y_b`` (nested braces are not used in the docs)."""
    match = re.search(r"\{([^{}]*)\}", pattern)
    if match is None:
        return [pattern]
    return [expanded for choice in match.group(1).split(",")
            for expanded in expand_braces(pattern[:match.start()] + choice + pattern[match.end():])]


def cited_results(text: str) -> list[str]:
    # A citation ends at the file's extension; a sentence's full stop after it is not part of it.
    return [cited.rstrip(".,") for cited in RESULT.findall(text)]


def test_the_pattern_helpers_expand_and_trim_as_the_docs_write_them():
    assert expand_braces("r/k_{a,b}_run{1,2}.json") == ["r/k_a_run1.json", "r/k_a_run2.json",
                                                        "r/k_b_run1.json", "r/k_b_run2.json"]
    assert cited_results("see `benchmarks/results/x_2026.json`.") == ["benchmarks/results/x_2026.json"]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_cited_result_file_and_image_exists(page):
    text = page.read_text()
    missing = []
    for cited in cited_results(text):
        for pattern in expand_braces(cited):
            if not any(ROOT.glob(pattern)):
                missing.append(pattern)
    for target in IMAGE.findall(text):
        if not re.match(r"[a-z]+://", target) and not (page.parent / target).exists():
            missing.append(target)
    assert not missing, f"{page.name} cites files that are not in the repository: {missing}"
