"""The site's home page is the README, so that there is one source.

The README lives at the repository root and links the guide pages as
`docs/NAME.md`; on the site, whose pages are docs/, the same page is
`index.md` and those links are `NAME.md`.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File, Files

_DOCS_LINK = re.compile(r"\]\(docs/")


def on_files(files: Files, config) -> Files:
    readme = Path(config["config_file_path"]).parent / "README.md"
    text = _DOCS_LINK.sub("](", readme.read_text(encoding="utf-8"))
    files.append(File.generated(config, "index.md", content=text))
    return files
