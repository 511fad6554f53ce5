"""mkdocs hooks (mkdocs.yml `hooks:`): the docs' source marks every code block that no test runs with
`title="illustrative"` (tests/test_docs.py enforces it); on the site that title would read as "not the real
command", so the marker is taken out of the page before it is rendered. GitHub shows no such title either."""

from __future__ import annotations

from typing import Any

MARKER = ' title="illustrative"'


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    return markdown.replace(MARKER, "")
