"""mkdocs hook: the repository's README.md is the site's home page (index.md).

The README links to docs pages as ``docs/PAGE.md`` and the pages link to it as ``../README.md``
(both resolve on GitHub); on the site the home page sits beside the pages, so those links become
``PAGE.md`` and ``index.md``. Nothing else is rewritten: `mkdocs build --strict` then checks every
link and anchor of every page, the README's included.
"""
from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

README = Path(__file__).resolve().parents[2] / "README.md"


def on_files(files, config):
    files.append(File.generated(config, "index.md", content=README.read_text(encoding="utf-8")))
    return files


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri == "index.md":
        return re.sub(r"\]\(docs/", "](", markdown)
    return re.sub(r"\]\(\.\./README\.md", "](index.md", markdown)
