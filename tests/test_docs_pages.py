"""README.md is a landing page and docs/ holds the rest: README stays short, its first section is the set-up
whose test command is the one CI runs, it links every page of docs/, and no link of README or docs/ points at a
file or a heading that does not exist."""

from __future__ import annotations

import re
from pathlib import Path

from helpers.config import REPO

README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*```")


def _prose(text: str) -> str:
    """The page without its code blocks (a link or a heading shown in code is not one)."""
    kept, in_code = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            in_code = not in_code
        elif not in_code:
            kept.append(line)
    return "\n".join(kept)


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the page's headings: lower case, punctuation dropped, spaces as hyphens, and
    -1, -2, ... after a repeated one."""
    anchors: set[str] = set()
    for line in _prose(page.read_text()).splitlines():
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
            candidate, repeat = slug, 0
            while candidate in anchors:
                repeat += 1
                candidate = f"{slug}-{repeat}"
            anchors.add(candidate)
    return anchors


def _links(page: Path) -> list[str]:
    return [target for target in LINK.findall(_prose(page.read_text())) if not re.match(r"[a-z]+:", target)]


def test_readme_is_a_landing_page_of_at_most_200_lines():
    assert len(README.read_text().splitlines()) <= 200


def test_readme_starts_with_the_set_up_and_its_test_command_is_the_one_ci_runs():
    text = README.read_text()
    sections = re.findall(r"^## (.+)$", _prose(text), flags=re.M)
    assert sections[0] == "Set up", sections
    ci = (REPO / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci.startswith("python3 -m venv .venv && ") and ci.endswith("-m pytest"), ci
    set_up = text.split("## Set up", 1)[1].split("\n## ", 1)[0]
    assert f"```\n{ci}\n```" in set_up


def test_readme_links_every_page_of_docs():
    linked = {(REPO / target.split("#")[0]).resolve() for target in _links(README) if target.startswith("docs/")}
    pages = {page.resolve() for page in (REPO / "docs").glob("*.md")}
    assert pages - linked == set(), "pages of docs/ that README does not link"


def test_every_relative_link_of_readme_and_docs_points_at_a_file_and_heading_that_exist():
    broken = []
    for page in PAGES:
        for target in _links(page):
            path, _, anchor = target.partition("#")
            destination = (page.parent / path).resolve() if path else page
            if not destination.exists():
                broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif anchor and destination.suffix == ".md" and anchor not in _anchors(destination):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_anchor_rule_matches_the_headings_the_pages_link():
    """The slug rule above, on headings with the punctuation these pages use."""
    page = REPO / "docs" / "troubleshooting.md"
    assert "quiet-by-default-verbosetrue-for-everything" in _anchors(page)
    assert "slurm-sweeps-submitit" in _anchors(REPO / "docs" / "sweeps.md")
    assert "tf_config-kubernetes-or-by-hand" in _anchors(REPO / "docs" / "clusters.md")
