"""The documentation holds together: every relative link in the README and docs/ resolves (the
file, and the heading an anchor names), and the README's policy is a valid policy."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from policies.loader import load_policy_text

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchor_of(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # no headings in code
    return {anchor_of(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not checked here
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no {resolved.relative_to(ROOT)}")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading #{anchor} in {resolved.name}")
    assert not broken, f"{page.name}: " + "; ".join(broken)


def test_anchors_follow_githubs_rule() -> None:
    assert anchor_of("Prefill/decode disaggregation (`make bench-pd`)") == (
        "prefilldecode-disaggregation-make-bench-pd"
    )


def test_the_readmes_policy_is_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    readme = (ROOT / "README.md").read_text()
    policy = readme.split("```yaml\n", 1)[1].split("```", 1)[0]
    monkeypatch.setenv("TEAM_A_KEY_SHA256", "a" * 64)
    loaded = load_policy_text(policy)
    assert set(loaded.pools) == {"chat", "small"} and len(policy.splitlines()) <= 10


def test_no_issue_numbers_in_user_docs_or_code() -> None:
    """Docs and docstrings say what is, not which ticket brought it."""
    issue = re.compile(r"\bissue \d+", re.I)
    sources = list(PAGES)
    packages = ("kvgate", "gateway", "epp", "backends", "policies", "loadtest", "bench", "tests")
    for package in packages:
        sources += sorted((ROOT / package).rglob("*.py"))
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in sources
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if issue.search(line) and path.name != "test_docs.py"
    ]
    assert not found, found
