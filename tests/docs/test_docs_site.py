"""The docs site builds with `mkdocs build --strict`, and its generated pages are fresh.

Why: a link to a moved page, an anchor that no longer exists or a page left out of the
navigation is a warning to MkDocs, and --strict (mkdocs.yml's validation settings turn
bad anchors and unrecognised links into warnings too) makes it an error here. The
reference pages (CLI, job spec, settings) and the benchmark figures are generated from
the code and the committed JSON by scripts/gen_docs.py; like the gRPC stubs
(tests/test_proto_fresh.py), a committed page that differs from what it writes now fails.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.docs.doc_text import DOCS, ROOT


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                             str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True,
                            timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-6000:]
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").is_file()


def test_every_page_is_in_the_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    missing = [str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if str(p.relative_to(DOCS)) not in nav]
    assert not missing, f"pages not in mkdocs.yml's nav: {missing}"


def test_generated_pages_are_fresh() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_docs.py"), "--check"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_readme_links_resolve() -> None:
    """The README is read on the repository's front page, outside MkDocs' link check."""
    import re

    readme = (ROOT / "README.md").read_text()
    links = [t for t in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme) if "://" not in t]
    assert links, "the README links into docs/"
    missing = [t for t in links if not (ROOT / t).exists()]
    assert not missing, f"README links to missing files: {missing}"


def test_readme_is_short() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


def test_simulator_page_tables_are_the_committed_runs() -> None:
    """docs/simulator.md quotes each committed run's policy table; brokerctl sim wrote
    those tables into docs/sim/**/results.md from result.json. They must not drift."""
    page = (DOCS / "simulator.md").read_text()
    for results in (DOCS / "sim" / "results.md", DOCS / "sim" / "4region" / "results.md",
                    DOCS / "sim" / "2region" / "results.md", DOCS / "sim" / "full" / "results.md"):
        text = results.read_text()
        start = text.index("| policy |")
        table = text[start: text.index("\n\n", start)]
        assert table in page, f"docs/simulator.md's table differs from {results.relative_to(ROOT)}"
