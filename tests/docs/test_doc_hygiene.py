"""What users read names no internal issue numbers and no paths of one machine.

Why: "see issue 12" means nothing outside the team's tracker, and `/work/...` or
`/root/...` exists on one build machine only. The README, every docs page, mkdocs.yml
and the files a user runs or reads first (the walkthrough, the install scripts, the
trace reader's and the simulator benchmark's defaults) are checked.
"""

from __future__ import annotations

import re

import pytest

from tests.docs.doc_text import ROOT, pages, rel

ISSUE = re.compile(r"\b[Ii]ssues? #?\d+\b|\b[Ii]ssue's\b")  # "issue 12", "issues 11 and", "the issue's"
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:work|root|home/\w+)/|/tmp/[\w.-]*\d{3,}")
EXTRA = ["mkdocs.yml", "examples/walkthrough.sh", "scripts/demo.sh", "scripts/test.sh",
         "simulator/trace.py", "benchmarks/bench_sim.py", "examples/inventories/us-west-2-plan.yaml"]


def files() -> list[str]:
    """The pages, the extra files above, and the console's templates and static files
    (the CLI's help is checked through the generated docs/reference/cli.md)."""
    console = sorted(rel(p) for d in ("templates", "static") for p in (ROOT / "console" / d).rglob("*")
                     if p.is_file())
    return [rel(p) for p in pages()] + EXTRA + console


@pytest.mark.parametrize("name", files())
def test_no_internal_issue_numbers(name: str) -> None:
    text = (ROOT / name).read_text()
    hits = [m.group(0) for m in ISSUE.finditer(text)]
    assert not hits, f"{name} names internal issues: {hits}"


@pytest.mark.parametrize("name", files())
def test_no_machine_specific_paths(name: str) -> None:
    text = (ROOT / name).read_text()
    hits = sorted({m.group(0) for m in MACHINE_PATH.finditer(text)})
    assert not hits, f"{name} names paths of one machine: {hits}"


def test_no_citation_of_a_missing_section() -> None:
    headings = {h.strip() for p in pages() for h in re.findall(r"^#+ (.+)$", p.read_text(), re.M)}
    for p in pages():
        for cited in re.findall(r'(?:README|docs/[\w/.-]+\.md),? "([^"]+)"', p.read_text()):
            assert any(cited.lower() in h.lower() for h in headings), (rel(p), cited)


def test_code_cites_only_sections_that_exist() -> None:
    """Comments and messages that send a reader to `README "X"` or `docs/page.md, "X"`
    must name a heading that is there (the README's sections moved into docs/)."""
    import subprocess

    listed = subprocess.run(["git", "ls-files", "*.py", "*.yaml", "*.sh", "*.md", "*.html"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split()
    headings = {h.strip().lower() for p in pages() for h in re.findall(r"^#+ (.+)$", p.read_text(), re.M)}
    bad = []
    for name in listed:
        path = ROOT / name
        if not path.is_file():
            continue
        lines = [re.sub(r"^\s*#+", "", line) for line in path.read_text(errors="replace").splitlines()]
        text = " ".join(" ".join(lines).split())  # a citation may wrap over comment lines
        for cited in re.findall(r'(?:README|docs/[\w/.-]+\.md),? "([^"]+)"', text):
            if not any(cited.lower() in h for h in headings):
                bad.append(f"{name}: {cited!r}")
    assert not bad, f"citations of sections that do not exist: {bad}"


FENCE = re.compile(r"^\s*```")


@pytest.mark.parametrize("page", [rel(p) for p in pages()])
def test_code_blocks_are_whole(page: str) -> None:
    """Every code fence is closed and no block is empty, and no paragraph ends in a comma.

    Why: a cut while moving text once left the README's architecture diagram outside
    its block (an empty block before it) and a sentence ending in "--no-console,".
    """
    lines = (ROOT / page).read_text().splitlines()
    fences = [i for i, line in enumerate(lines) if FENCE.match(line)]
    assert len(fences) % 2 == 0, f"{page}: an unclosed code fence (line {fences[-1] + 1})"
    for start, end in zip(fences[::2], fences[1::2], strict=True):
        assert end - start > 1, f"{page}: an empty code block at line {start + 1}"
    inside = set()
    for start, end in zip(fences[::2], fences[1::2], strict=True):
        inside.update(range(start, end + 1))
    cut = [i + 1 for i, line in enumerate(lines[:-1])
           if i not in inside and line.rstrip().endswith(",") and not lines[i + 1].strip()
           and not line.lstrip().startswith(("|", "-", "*", "<"))]
    assert not cut, f"{page}: a paragraph ends in a comma (cut text?) at lines {cut}"
