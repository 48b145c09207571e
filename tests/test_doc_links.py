"""Every relative link and image in README.md and docs/*.md points at a file of the repository, and every
``#anchor`` into a Markdown file at one of its headings (GitHub's slugs); links inside code are not links."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.S | re.M)
INLINE = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)


def prose(text: str) -> str:
    """The text without fenced code blocks and inline code (where brackets are code, not links)."""
    return INLINE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (hyphens and underscores kept), spaces to hyphens."""
    h = re.sub(r"<[^>]+>", "", heading).strip().lower().replace("`", "")
    h = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", h)  # a link in a heading: its text
    return re.sub(r"[^\w\- ]", "", h).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    out: set[str] = set()
    seen: dict[str, int] = {}
    for line in FENCE.sub("", path.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")  # GitHub numbers repeated headings
    out |= set(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", path.read_text(encoding="utf-8")))
    return out


def links(path: Path) -> list[str]:
    return [m.group(1) for m in LINK.finditer(prose(path.read_text(encoding="utf-8")))]


def broken(path: Path, root: Path = ROOT) -> list[str]:
    bad = []
    for target in links(path):
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # http:, https:, mailto: ... (not checked: offline)
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            bad.append(f"{target} (no such file)")
        elif not dest.resolve().is_relative_to(root):
            bad.append(f"{target} (outside the repository)")
        elif anchor and dest.suffix == ".md" and anchor.lower() not in anchors(dest):
            bad.append(f"{target} (no heading #{anchor} in {dest.name})")
    return bad


@pytest.mark.parametrize("path", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_relative_links_resolve(path: Path) -> None:
    assert not broken(path), f"{path.relative_to(ROOT)}: broken links: {broken(path)}"


def test_the_checker_finds_what_it_should(tmp_path: Path) -> None:
    """The checker is not vacuous: on a made-up page it flags exactly the broken links and anchors."""
    (tmp_path / "other.md").write_text("# A heading: with `code`\n## Twice\n## Twice\n")
    (tmp_path / "fig.png").write_bytes(b"png")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md) [ok anchor](other.md#a-heading-with-code) [second](other.md#twice-1) ![img](fig.png)\n"
        "[self](#local) [web](https://example.org/x) [gone](missing.md) [bad anchor](other.md#nowhere)\n"
        "![gone img](figures/none.png) `[not a link](nowhere.md)`\n```\n[code](nowhere2.md)\n```\n# Local\n"
    )
    assert links(page)[:4] == ["other.md", "other.md#a-heading-with-code", "other.md#twice-1", "fig.png"]
    assert broken(page, tmp_path) == [
        "missing.md (no such file)",
        "other.md#nowhere (no heading #nowhere in other.md)",
        "figures/none.png (no such file)",
    ]
    assert sum(len(links(p)) for p in DOCS) > 50  # the real pages have links to check
