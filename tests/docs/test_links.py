"""The project's documents point at each other, and the code at them, in a few written forms;
each one must reach what it names, so that moving a section (docs/operations.md split into
docs/tls.md and docs/backup.md, issue 38) or renaming a file cannot leave a dead pointer:

- a Markdown link `[text](path#anchor)` in a document: the file exists and the anchor is one
  of its headings' GitHub slugs (none is written today; the check waits for the first);
- a repository path a document names (`docs/tls.md`, `tests/cli/test_units.py`,
  `deploy/systemd/`): it exists;
- a section named after a document's path, in a document or in the code: `FILE section N`
  or `FILE §N` (a heading `N. ...`), `FILE, "Title"` or `FILE, *Title*` (a heading, without
  its number, or a paragraph's bold lead `**Title.**`, that starts with Title, in any case);
  `(section N)` alone in a document is a heading of that document;
- `ADR NNNN`, anywhere: docs/adr/NNNN-*.md exists.

Pure reading of files: no VM, no server."""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md",
                    *(ROOT / "docs").rglob("*.md"), *(ROOT / "spec").glob("*.md")])
# Where the code names documents' sections and ADRs (the documents are read as well).
CODE_DIRS = ("src", "tests", "deploy", "scripts", "bench", "sdk-ts/src", "guest-agent/src")
CODE_SUFFIXES = {".py", ".ts", ".rs", ".sh", ".service", ".env", ".json", ".toml"}
CODE_FILES = ("Makefile", "pyproject.toml", ".ci/run")
SKIPPED_PARTS = {"node_modules", "__pycache__", "dist", "target"}
# The top-level folders a path in a document may start with (others are a guest's or a
# host's paths, e.g. /etc/pandastack/, or paths inside the package, e.g. host/gc.py); one in
# a subproject's own src/ or scripts/ (the TypeScript SDK's ADR) is found there.
TOP = ("docs", "spec", "tests", "deploy", "scripts", "bench", "src", "sdk-ts", "guest-agent")
SUBPROJECTS = ("", "sdk-ts/", "guest-agent/")
# A path written to show the form of one (CONTRIBUTING's `pytest tests/path/test_x.py`).
EXAMPLES = {"tests/path/test_x.py"}

LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")
# With *, <...> or {...} in it, a path is a pattern (`tests/e2e/test_e2b_*.py`): not checked.
PATH = re.compile(rf"(?<![\w./-])((?:{'|'.join(TOP)})/[\w./*<>{{}},-]*[\w/*>}}])")
DOC = r"(?<![\w/.-])((?:[\w-]+/)*[\w-]+\.md)`?"
SECTION_NUMBER = re.compile(DOC + r",?\s+(?:section\s+|§)(\d+)\b")
# A title may run on to the next line of the text (not further).
SECTION_TITLE = re.compile(DOC + r",\s+(?:\"([^\"\n]+(?:\n[^\"\n]+)?)\""
                           r"|\*([^*\n]+(?:\n[^*\n]+)?)\*)")
OWN_SECTION = re.compile(r"\(section (\d+)[,)]")
ADR = re.compile(r"\bADRs? (\d{4})\b")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*$", re.MULTILINE)
BOLD_LEAD = re.compile(r"^\*\*([^*\n]+?)\.?\*\*", re.MULTILINE)
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def code_files() -> Iterator[Path]:
    """The code's files (this one left out: its last test writes pointers to nothing)."""
    for name in CODE_DIRS:
        for path in sorted((ROOT / name).rglob("*")):
            if path.suffix in CODE_SUFFIXES and path.is_file() and path != Path(__file__) \
                    and not SKIPPED_PARTS & set(path.parts):
                yield path
    yield from (ROOT / name for name in CODE_FILES if (ROOT / name).is_file())


@cache
def headings(path: Path) -> tuple[str, ...]:
    """The headings' texts (code blocks left out: a `# comment` there is none)."""
    return tuple(HEADING.findall(FENCE.sub("", path.read_text())))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to
    hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def titles(path: Path) -> list[str]:
    """What a `"Title"` or `*Title*` may name: headings without their `N. ` and bold leads."""
    leads = BOLD_LEAD.findall(FENCE.sub("", path.read_text()))
    return [re.sub(r"^\d+\.\s+", "", h).lower() for h in headings(path)] + \
        [lead.lower() for lead in leads]


def numbered(path: Path, number: str) -> bool:
    return any(re.match(rf"{number}\.?\s", h) for h in headings(path))


def resolve(name: str, where: Path) -> Path | None:
    """A document named as `name` in `where`: a repository path (docs/tls.md), else beside
    `where` (0048-tls.md in docs/adr/), else a file of that name in docs/."""
    for candidate in (ROOT / name, where.parent / name, ROOT / "docs" / name):
        if candidate.is_file():
            return candidate
    return None


def section_problems(path: Path, text: str) -> list[str]:
    """The pointers to another document's sections in `text` (of `path`) that miss."""
    problems = []
    for match in SECTION_NUMBER.finditer(text):
        name, number = match.groups()
        target = resolve(name, path)
        if target is None:
            problems.append(f"{rel(path)}: {match.group(0)!r}: no such document")
        elif not numbered(target, number):
            problems.append(f"{rel(path)}: {match.group(0)!r}: {rel(target)} has no "
                            f"section {number}")
    for match in SECTION_TITLE.finditer(text):
        name, quoted, starred = match.groups()
        title = " ".join((quoted or starred).split()).lower()
        target = resolve(name, path)
        if target is None:
            problems.append(f"{rel(path)}: {match.group(0)!r}: no such document")
        elif not any(t.startswith(title) for t in titles(target)):
            problems.append(f"{rel(path)}: {match.group(0)!r}: no heading of {rel(target)} "
                            f"starts with {title!r}")
    return problems


def adr_problems(path: Path, text: str) -> list[str]:
    adrs = ROOT / "docs" / "adr"
    return [f"{rel(path)}: ADR {number}: no docs/adr/{number}-*.md"
            for number in sorted(set(ADR.findall(text))) if not any(adrs.glob(f"{number}-*.md"))]


def document_problems(path: Path, text: str) -> list[str]:
    """Every pointer of a document's `text` that misses: sections and ADRs as in the code,
    and its links, its own sections and the repository paths it names."""
    problems = section_problems(path, text) + adr_problems(path, text)
    for match in LINK.finditer(text):
        target = match.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not ours to check
            continue
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists():
            problems.append(f"{rel(path)}: link {target!r}: no such file")
        elif anchor and (linked.suffix != ".md" or anchor not in map(slug, headings(linked))):
            problems.append(f"{rel(path)}: link {target!r}: no heading with that anchor")
    problems += [f"{rel(path)}: (section {number}): it has no section {number}"
                 for number in OWN_SECTION.findall(text) if not numbered(path, number)]
    for name in sorted(set(PATH.findall(text)) - EXAMPLES):
        if not set("*<{") & set(name) and \
                not any((ROOT / sub / name).exists() for sub in SUBPROJECTS):
            problems.append(f"{rel(path)}: {name}: no such file or directory")
    return problems


@pytest.mark.parametrize("path", DOCUMENTS, ids=rel)
def test_a_documents_links_paths_and_sections_resolve(path: Path) -> None:
    problems = document_problems(path, path.read_text())
    assert not problems, "\n".join(problems)


def test_the_codes_pointers_into_the_documents_resolve() -> None:
    problems = []
    for path in code_files():
        text = path.read_text(errors="replace")
        problems += section_problems(path, text) + adr_problems(path, text)
    assert not problems, "\n".join(problems)


def test_the_checks_catch_what_they_look_for() -> None:
    """What the checks rest on: each form, pointing at nothing, is found (and pointing at
    something, is not); the code is searched at all; GitHub's slug of a heading with markup."""
    guide = ROOT / "docs" / "operations.md"
    good = ('docs/operations.md, section 1; spec/guest-protocol.md §3; docs/tls.md, "Caddy '
            'in front"; docs/tls.md, *nginx\n in front*; README.md, *Many hosts*; ADR 0048; '
            "(section 2); `deploy/systemd/pandastack.env`; tests/e2e/test_e2b_*.py; "
            "[the TLS guide](tls.md#certificates-from-your-own-ca)")
    assert document_problems(guide, good) == []
    assert (len(SECTION_NUMBER.findall(good)), len(SECTION_TITLE.findall(good)),
            len(LINK.findall(good)), len(OWN_SECTION.findall(good))) == (2, 3, 1, 1)
    bad = ["docs/operations.md section 99", "spec/guest-protocol.md §99",
           'docs/tls.md, "No such heading"', "docs/tls.md, *No such\n  heading*",
           "docs/gone.md, section 1", "ADR 9999", "(section 99)", "tests/cli/test_gone.py",
           "[x](gone.md)", "[x](tls.md#no-such-heading)"]
    for pointer in bad:
        assert document_problems(guide, pointer), pointer
    makefile = ROOT / "Makefile"
    assert makefile in set(code_files())
    assert SECTION_TITLE.search(makefile.read_text()), "the Makefile's pointer to a guide"
    assert slug("3. The services: `pandastack install-units`") == \
        "3-the-services-pandastack-install-units"
