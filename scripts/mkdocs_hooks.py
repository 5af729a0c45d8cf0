"""The documentation site's build hooks (mkdocs.yml: ``hooks`` and the Python handler's ``extensions``).

- docs/index.md is both the site's home page and the package's long description, where only absolute
  links work: a page's links to the published site (``](SITE_URL/spec/#9-errors)``) become links to its
  sources (``](spec.md#9-errors)``), so that ``mkdocs build --strict`` checks each page and anchor, and
  the built site links to itself; so do the docstrings' links to the site, in the API reference.
- Docstrings name objects with reST roles (``:class:`Outcome```) and open code blocks with ``::``; the
  API reference, rendered from Markdown, shows each role as code and each ``name::`` as ``name:``.
"""

from __future__ import annotations

import posixpath
import re
from typing import Any

import griffe
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import Files
from mkdocs.structure.pages import Page

_ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj):`~?([^`]+)`")
_LITERAL_BLOCK = re.compile(r"(?<=\S)::$", re.MULTILINE)  # "name::" before an indented block


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """``markdown`` with each link to a page of ``config.site_url`` made relative to ``page``."""
    site = config.site_url or ""
    if not site:
        return markdown
    link = re.compile(r"\]\(" + re.escape(site.rstrip("/") + "/") + r"([^)#\s]*)(#[^)\s]*)?\)")
    here = posixpath.dirname(page.file.src_uri) or "."

    def to_source(match: re.Match[str]) -> str:
        path = match.group(1).strip("/")
        source = f"{path}.md" if path else "index.md"
        return f"]({posixpath.relpath(source, here)}{match.group(2) or ''})"

    return link.sub(to_source, markdown)


def on_page_content(html: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """``html`` with each remaining link to ``config.site_url`` (a docstring's, in the API reference)
    made relative, so that the built site links to itself wherever it is served."""
    site = config.site_url or ""
    if not site:
        return html
    link = re.compile(r'href="' + re.escape(site.rstrip("/") + "/") + r'([^"#]*)')
    here = posixpath.dirname(page.url) or "."

    def relative(match: re.Match[str]) -> str:
        path = match.group(1)
        target = posixpath.relpath(path or ".", here)
        return f'href="{target}{"/" if not path or path.endswith("/") else ""}'

    return link.sub(relative, html)


class ReSTRoles(griffe.Extension):
    """Shows ``:role:`name``` in a docstring as the code ``name``, and ``name::`` as ``name:``."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _LITERAL_BLOCK.sub(":", _ROLE.sub(r"``\1``", obj.docstring.value))
