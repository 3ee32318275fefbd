"""Checks of the built HTML, run by the docs build when it has written every page
(a ``build-finished`` handler; ``conf.py`` loads this file as an extension). The build
fails, listing what it found, when a page

- loads anything from the network when it is viewed: a ``<script>``, stylesheet, image
  or frame whose address is ``http://``, ``https://`` or ``//``, or a stylesheet of the
  site that imports or ``url()``-loads such an address (math renders from the MathJax
  copy that ``sphinx-mathjax-offline`` puts in ``_static/mathjax``), or
- links to a file of the site that is not there, or to an anchor its page lacks:
  every relative ``href`` and ``src`` must name a file of the build, and its part after
  ``#`` (if any) an element of that page, or
- is the API reference and lacks an entry for a name it documents
  (``api_page.documented_ids``).

The functions take HTML text and a folder, so ``tests/test_docs_reference.py`` runs
them on small pages without building the docs.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

#: the attributes through which a page loads something as it is shown, by tag
LOADS = {
    "script": "src",
    "img": "src",
    "iframe": "src",
    "embed": "src",
    "source": "src",
    "audio": "src",
    "video": "src",
    "object": "data",
    "link": "href",
}
#: ``<link rel=...>`` values that do not load anything as the page is shown
LINK_NOT_LOADED = {"canonical", "alternate", "author", "license", "help", "search", "index", "next", "prev"}
#: schemes of addresses that name no file of the site (mailto:, data:, javascript:)
NOT_FILES = ("mailto:", "data:", "javascript:", "tel:")


class _Refs(HTMLParser):
    """Collects a page's (tag, attribute, address) triples and its element ids."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.refs: list[tuple[str, str, str, str]] = []  # tag, attribute, address, link rel
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value or "" for name, value in attrs}
        if values.get("id"):
            self.ids.add(values["id"])
        for name in ("src", "href", "data"):
            if name in values:
                self.refs.append((tag, name, values[name].strip(), values.get("rel", "").lower()))


def _parse(html: str) -> _Refs:
    parser = _Refs()
    parser.feed(html)
    parser.close()
    return parser


def _remote(address: str) -> bool:
    return address.lower().startswith(("http://", "https://", "//"))


def network_loads(html: str) -> list[str]:
    """The addresses on the network that the page loads as it is shown (scripts,
    stylesheets, icons, images, frames), as ``<tag attribute="address">``."""
    found = []
    for tag, attribute, address, rel in _parse(html).refs:
        if LOADS.get(tag) != attribute or not _remote(address):
            continue
        if tag == "link" and rel and set(rel.split()) <= LINK_NOT_LOADED:
            continue
        found.append(f'<{tag} {attribute}="{address}">')
    return found


#: how a stylesheet loads from the network: ``url(https://...)``, ``@import "//..."``
_CSS_REMOTE = re.compile(r"""(?:url\(\s*['"]?|@import\s+['"])((?:https?:)?//[^'")\s]*)""", re.I)


def css_network_loads(css: str) -> list[str]:
    """The addresses on the network that a stylesheet loads (fonts, images, imports)."""
    return _CSS_REMOTE.findall(css)


def missing_targets(html: str, page: Path, root: Path, ids_of: Callable[[Path], set[str]] | None = None) -> list[str]:
    """The relative addresses in ``html`` (the text of ``page``, a file under the
    site's folder ``root``) that name no file of the site, or (given ``ids_of``, the
    ids of a page of the site) an anchor that the page they name lacks."""
    found = []
    for _, _, address, _ in _parse(html).refs:
        if not address or _remote(address) or address.lower().startswith(NOT_FILES):
            continue
        parts = urlsplit(address)
        if parts.scheme or parts.netloc:  # file:, ftp: and the like: not a relative address
            continue
        path = unquote(parts.path)
        if not path:
            target = page.resolve()
        else:
            target = ((root / path.lstrip("/")) if path.startswith("/") else (page.parent / path)).resolve()
        if target.is_dir():
            target = target / "index.html"
        if not target.is_file() or not target.is_relative_to(root.resolve()):
            found.append(address)
        elif ids_of is not None and parts.fragment and target.suffix == ".html":
            if unquote(parts.fragment) not in ids_of(target):
                found.append(address)
    return sorted(set(found))


def missing_ids(html: str, ids: list[str]) -> list[str]:
    """The ids in ``ids`` that no element of the page has."""
    have = _parse(html).ids
    return [i for i in ids if i not in have]


def problems(outdir: Path, api_ids: list[str]) -> list[str]:
    """Every problem of the site in ``outdir``, one line each (empty when there is none)."""
    found = []
    api_html = ""
    ids: dict[Path, set[str]] = {}

    def ids_of(page: Path) -> set[str]:
        if page not in ids:
            ids[page] = _parse(page.read_text(encoding="utf-8")).ids
        return ids[page]

    for page in sorted(outdir.rglob("*.html")):
        html = page.read_text(encoding="utf-8")
        name = page.relative_to(outdir).as_posix()
        found += [f"{name}: loads {ref} from the network" for ref in network_loads(html)]
        missing = missing_targets(html, page, outdir, ids_of)
        found += [f"{name}: links to {ref}, which names no file or anchor of the build" for ref in missing]
        if name.startswith("api/"):
            api_html += html
    for sheet in sorted(outdir.rglob("*.css")):
        name = sheet.relative_to(outdir).as_posix()
        found += [f"{name}: loads {ref} from the network" for ref in css_network_loads(sheet.read_text("utf-8"))]
    found += [f"api/: no entry with id {i!r}" for i in missing_ids(api_html, api_ids)]
    return found


def _check(app: Any, exc: BaseException | None) -> None:
    """The ``build-finished`` handler: one error a problem, and a failed build."""
    if exc is not None or app.builder.format != "html":
        return
    import api_page
    from sphinx.util import logging

    logger = logging.getLogger(__name__)
    for problem in problems(Path(app.outdir), api_page.documented_ids()):
        logger.error(problem, type="gameopt", subtype="built_html")
        app.statuscode = 1  # failed whatever the warning options: -W or not


def setup(app: Any) -> dict[str, Any]:
    # after every other build-finished handler (sphinx-mathjax-offline copies MathJax in one)
    app.connect("build-finished", _check, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
