"""mkdocs hook: the switches page's table, generated from the registered patches at build time."""

from __future__ import annotations

MARKER = "<!-- switches -->"


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        return markdown
    from cogvideox_torchax.patches.registry import switches_markdown

    return markdown.replace(MARKER, switches_markdown())
