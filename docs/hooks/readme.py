"""The site's home page is the README, and its changelog the CHANGELOG, so
that each has one source.

The README lives at the repository root and links the guide pages as
`docs/NAME.md`; on the site, whose pages are docs/, the same page is
`index.md` and those links are `NAME.md`; `CHANGELOG.md` is `changelog.md`.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File, Files

_DOCS_LINK = re.compile(r"\]\(docs/")
_CHANGELOG_LINK = re.compile(r"\]\(CHANGELOG\.md")


def on_files(files: Files, config) -> Files:
    root = Path(config["config_file_path"]).parent
    text = _DOCS_LINK.sub("](", (root / "README.md").read_text(encoding="utf-8"))
    text = _CHANGELOG_LINK.sub("](changelog.md", text)
    files.append(File.generated(config, "index.md", content=text))
    changelog = (root / "CHANGELOG.md").read_text(encoding="utf-8")
    files.append(File.generated(config, "changelog.md", content=changelog))
    return files
