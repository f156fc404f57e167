"""docs/reference.md and docs/operations.md open with a table of contents (issue 67, item
11), and every link between the repository's Markdown files names a file and a heading
that exist (GitHub's anchors: lower case, punctuation dropped, spaces as hyphens)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "bench").glob("*.md"))]  # fmt: skip
LINK = re.compile(r"\]\(([^)\s]+)\)")


def headings(text: str) -> list[tuple[int, str]]:
    out, fence = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and (found := re.match(r"^(#{1,6}) (.+)$", line)):
            out.append((len(found.group(1)), found.group(2).strip()))
    return out


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, title in headings(text):
        base = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


@pytest.mark.parametrize("name", ["reference.md", "operations.md"])
def test_a_table_of_contents_lists_every_section(name: str):
    text = (ROOT / "docs" / name).read_text()
    head, _, _ = text.partition("\n## ")
    assert "**Contents**" in head, name
    for level, title in headings(text):
        if level == 2:
            assert f"[{title}](#" in head, f"{name}: {title!r} missing from the contents"


def test_links_between_pages_resolve():
    broken = []
    for page in PAGES:
        text = page.read_text()
        for target in LINK.findall(text):
            if re.match(r"^[a-z]+:", target):  # http(s), mailto
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, broken
