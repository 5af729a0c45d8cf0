"""Links into the documentation site from outside it: docstrings, comments and the long description.

``mkdocs build --strict`` (the "docs" phase of scripts/test.sh) checks every link between the site's
pages; it cannot see the absolute links that the installed code and the package's long description
(docs/index.md, on the package index) make to the published site. These tests check, without building
anything, that each such link names a page in docs/ and, where it has one, a heading of that page.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
#: The installed packages: they cite the contract by its address on the site.
INSTALLED = ("consensus_api", "consensus_testkit", "consensus_chaos", "backends")
#: Where links to the site may be written: the installed packages, the project's tools, the docs.
SOURCES = (*INSTALLED, "benchmarks", "scripts", "tests")


def site_url() -> str:
    """The site's address, as mkdocs.yml states it (ending with a slash)."""
    match = re.search(r"^site_url:\s*(\S+)\s*$", (ROOT / "mkdocs.yml").read_text(), re.MULTILINE)
    assert match, "mkdocs.yml has no site_url"
    return match.group(1).rstrip("/") + "/"


def heading_ids(page: Path) -> set[str]:
    """The ids of ``page``'s headings as GitHub and the site (mkdocs.yml's slugify) both make them."""
    ids: set[str] = set()
    fenced = False
    for line in page.read_text().splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and (heading := re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)):
            text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(1)).replace("`", "")
            ids.add(re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-"))
    return ids


def source_files() -> list[Path]:
    """Every Python file under ``SOURCES``, and the Markdown pages of docs/."""
    return python_files(SOURCES) + sorted(DOCS.rglob("*.md"))


def python_files(folders: tuple[str, ...]) -> list[Path]:
    """The Python sources under ``folders``, without build output or virtual environments."""
    files = [path for name in folders for path in (ROOT / name).rglob("*.py")]
    return [path for path in files if not {"build", ".venv"} & set(path.relative_to(ROOT).parts)]


def site_links() -> list[tuple[str, str]]:
    """(file, link) for every link to the site in ``source_files()``."""
    pattern = re.compile(re.escape(site_url()) + r"[^\s)>\"'`]*")
    return [
        (str(path.relative_to(ROOT)), link.rstrip(".,;:"))
        for path in source_files()
        for link in pattern.findall(path.read_text(errors="replace"))
    ]


def test_the_site_has_one_address() -> None:
    """The package's Documentation URL is the site mkdocs.yml builds."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["urls"]["Documentation"] == site_url()


def test_links_to_the_site_exist() -> None:
    """Each link to the site names a page of docs/ and, outside the generated API reference, one of its
    headings."""
    links = site_links()
    assert any(link.startswith(site_url() + "spec/#") for _, link in links), "no docstring links the contract"
    broken = []
    for source, link in links:
        path, _, anchor = link.removeprefix(site_url()).partition("#")
        page = DOCS / (f"{path.strip('/')}.md" if path.strip("/") else "index.md")
        if not page.is_file():
            broken.append(f"{source}: {link}: no page {page.relative_to(ROOT)}")
        elif anchor and "api" not in page.relative_to(DOCS).parts and anchor not in heading_ids(page):
            broken.append(f"{source}: {link}: no heading #{anchor} in {page.relative_to(ROOT)}")
    assert not broken, "\n".join(broken)


def test_docstrings_cite_the_contract_by_link() -> None:
    """No installed module cites the contract by a path (docs/spec.md) that exists only in the repository."""
    citing = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in python_files(INSTALLED)
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"docs/spec\.md|\bspec(\.md)? sections? \d", line, re.IGNORECASE)
    ]
    assert not citing, "cite the contract as <" + site_url() + "spec/#ANCHOR>: " + ", ".join(citing)


def test_the_long_description_links_absolutely() -> None:
    """The long description (pyproject's ``readme``, the site's home page) is read off the repository:
    its links are absolute."""
    readme = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["readme"]
    assert readme == "docs/index.md"
    targets = re.findall(r"\]\(([^)\s]+)\)", (ROOT / readme).read_text())
    assert targets
    assert [target for target in targets if not target.startswith("https://")] == []
