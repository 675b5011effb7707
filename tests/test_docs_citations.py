"""Every citation in the project points inside the project, at a section that exists.

Code comments, docstrings, tests and docs cite the documents they follow as `docs/<name>.md §N` (e.g.
`docs/domain.md §4`, `docs/architecture.md §3.2`), never notes kept outside the repository. A cited document
numbers its headings `## N. Title` and `### N.M Title` (the trailing dot optional), and a citation of §N must name
one of them: a renumbered section breaks this test, not the reader.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("solvers", "engine", "console", "tests", "benchmarks", "docs", "templates", "static", "README.md",
           "Makefile")
SKIPPED_DIRS = {"__pycache__"}
THIS_FILE = str(Path(__file__).resolve().relative_to(ROOT))

# Notes kept beside the repository, not in it: citing them (by file name, by bare name and section number, or by
# their folder beside the checkout) sends a reader somewhere they cannot follow.
OUTSIDE = re.compile(r"(?<![\w/])(?:DOMAIN|ARCHITECTURE|STYLE)(?:\.md|\s+§?\d)|(?:\.\./|/work/)shared\b")
# `docs/domain.md §4`, `domain.md §3, §4`, `docs/architecture.md, §5` ... : a document name, then one or more §N.
CITATION = re.compile(r"(?<![\w.-])(?:[\w.-]*/)*(?P<doc>[a-z][a-z0-9_-]*)\.md[)\]`'\"]*[ ,]*"
                      r"(?P<sections>§\s?\d+(?:\.\d+)*(?:(?:\s*,\s*|\s+and\s+|\s*[-–]\s*)§\s?\d+(?:\.\d+)*)*)")
SECTION = re.compile(r"§\s?(\d+(?:\.\d+)*)")
NUMBERED_HEADING = re.compile(r"^#{2,6}\s+(\d+(?:\.\d+)*)\.?\s+\S", re.MULTILINE)


def _scanned_files() -> list[Path]:
    files = []
    for name in SCANNED:
        path = ROOT / name
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files.extend(p for p in sorted(path.rglob("*"))
                         if p.is_file() and not SKIPPED_DIRS & set(p.relative_to(ROOT).parts))
    return files


def _text(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data:  # images and other binaries cite nothing
        return None
    return data.decode("utf-8", errors="replace")


def _texts() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): text for p in _scanned_files() if (text := _text(p)) is not None}


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def numbered_sections(doc: Path) -> set[str]:
    """The section numbers a document's headings carry: `## 4. The budget chain` gives "4"."""
    return set(NUMBERED_HEADING.findall(doc.read_text()))


def citations(text: str) -> list[tuple[int, str, str]]:
    """(line, document name, section) for every `docs/<name>.md §N` in `text`."""
    found = []
    for match in CITATION.finditer(text):
        for section in SECTION.findall(match["sections"]):
            found.append((_line_of(text, match.start()), match["doc"], section))
    return found


def test_the_citation_pattern_reads_the_forms_the_project_writes():
    text = ("see docs/domain.md §4.\n(docs/domain.md §3, §4)\n`docs/architecture.md §3.2`\n"
            "[domain.md §7](domain.md#7-the-frontier) and docs/console.md, no section\n")
    assert citations(text) == [(1, "domain", "4"), (2, "domain", "3"), (2, "domain", "4"),
                               (3, "architecture", "3.2"), (4, "domain", "7")]
    outside = ["DOMAIN" + ".md §4", "(ARCHITECTURE" + ".md)", "STYLE" + ".md", "DOMAIN" + " 9", "../" + "shared" + "/x"]
    assert [bool(OUTSIDE.search(text)) for text in outside] == [True] * len(outside)
    assert not OUTSIDE.search("docs/domain.md §4, docs/architecture.md §5, a shared" + "/ folder, the domain 9")
    assert NUMBERED_HEADING.findall("## 4. The budget chain\n### 3.2 Plan\n## Notes\n# 1. Title\n") == ["4", "3.2"]


def test_nothing_cites_documents_outside_the_repository():
    offenders = [f"{name}:{_line_of(text, m.start())}: {m.group()}"
                 for name, text in _texts().items() for m in OUTSIDE.finditer(text)]
    assert not offenders, ("cite docs/domain.md §N or docs/architecture.md §N instead of notes kept outside the "
                           "repository:\n" + "\n".join(offenders))


def test_every_section_citation_names_an_existing_section():
    broken = []
    sections: dict[str, set[str] | None] = {}
    for name, text in _texts().items():
        if name == THIS_FILE:  # its examples of the citation forms are not citations
            continue
        for line, doc, section in citations(text):
            if doc not in sections:
                path = ROOT / "docs" / f"{doc}.md"
                sections[doc] = numbered_sections(path) if path.is_file() else None
            if sections[doc] is None:
                broken.append(f"{name}:{line}: docs/{doc}.md §{section}: there is no docs/{doc}.md")
            elif section not in sections[doc]:
                broken.append(f"{name}:{line}: docs/{doc}.md §{section}: no heading numbered {section} "
                              f"(it has {', '.join(sorted(sections[doc], key=_order)) or 'no numbered headings'})")
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("doc", ["domain", "architecture"])
def test_the_cited_documents_exist_and_number_their_sections(doc):
    path = ROOT / "docs" / f"{doc}.md"
    assert path.is_file(), f"docs/{doc}.md is missing"
    assert numbered_sections(path), f"docs/{doc}.md has no numbered headings (`## 1. Title`) to cite"


def _order(section: str) -> tuple[int, ...]:
    return tuple(int(part) for part in section.split("."))
