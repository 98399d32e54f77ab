"""MkDocs hook: adds the API reference pages, generated from the pydantic models.

mkdocs.yml names this file under `hooks:`; MkDocs calls `on_files` before it builds the
nav, so the generated pages can be nav entries like any written page. The pages themselves
come from sailplan_dev.apidocs (typed, tested); nothing generated is committed.
"""

from __future__ import annotations

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

from sailplan_dev.apidocs import reference_pages


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for page in reference_pages():
        files.append(File.generated(config, page.path, content=page.markdown))
    return files
