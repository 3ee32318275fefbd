"""Two fixes of ``sphinx.ext.viewcode``'s links (Sphinx 8 and 9), loaded by ``conf.py``
as an extension; ``build_checks`` would refuse the build without them.

- The module of a documented object, for its [source] link: viewcode's own lookup
  answers the module of the *value* for a property, a class attribute or a module's
  data (``builtins`` for ``first_order = True`` or ``State = dict[...]``), and its
  ``_modules/index.html`` then links to a ``builtins.html`` it never writes. The class
  or module that holds them is the one whose source has them.
- The [docs] links of a source page back to the reference: viewcode builds each from
  the name of the module that first led it to the source file (``gameopt`` for
  :mod:`gameopt.updates`, first met through ``gameopt.Adam``), so a name documented
  under another module (``gameopt.updates.AdamState``) gets an anchor that is not on
  the page (``#gameopt.AdamState``). Each such link is pointed at the entry the page
  has for that object.
"""

from __future__ import annotations

import html
import importlib
import inspect
import posixpath
import re
from typing import Any

_BACK = re.compile(r'(<a class="viewcode-back" href=")([^"#]*)#([^"]+)(")')


def _viewcode_module(app: Any, modname: str, fullname: str) -> str | None:
    """The module whose source holds ``modname.fullname``, or None for viewcode's own
    answer (a class or a function: the module that defines it)."""
    try:
        obj: object = importlib.import_module(modname)
    except ImportError:
        return None
    owner = modname
    for part in fullname.split("."):
        if inspect.isclass(obj):
            owner, obj = obj.__module__, inspect.getattr_static(obj, part, None)
        else:
            obj = getattr(obj, part, None)
    if isinstance(obj, property) and obj.fget is not None:
        return obj.fget.__module__
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if inspect.isclass(obj) or inspect.isroutine(obj):
        return None
    return owner


def backlink_anchor(anchor: str, module: str, ids: dict[str, str]) -> str:
    """The anchor a [docs] link of ``module``'s source page should have: ``anchor``
    itself when it is an entry's, else the entry of the same object under another
    module (``module``'s own first, then the only one whose name ends the same way).
    ``ids`` maps each documented Python object's full name to its anchor."""
    if anchor in ids.values():
        return anchor
    parts = anchor.split(".")
    for i in range(1, len(parts)):
        name = ".".join(parts[i:])
        if f"{module}.{name}" in ids:
            return ids[f"{module}.{name}"]
        matches = {ids[full] for full in ids if full.endswith("." + name)}
        if len(matches) == 1:
            return matches.pop()
    return anchor


def _fix_backlinks(app: Any, pagename: str, templatename: str, context: dict[str, Any], doctree: Any) -> None:
    if not pagename.startswith("_modules/") or "body" not in context:
        return
    module = pagename.removeprefix("_modules/").replace("/", ".")
    objects = app.env.get_domain("py").objects

    def fix(match: re.Match[str]) -> str:
        page = posixpath.normpath(posixpath.join(posixpath.dirname(pagename), match[2]))
        docname = page.removesuffix(app.builder.out_suffix)
        ids = {name: entry.node_id for name, entry in objects.items() if entry.docname == docname}
        anchor = backlink_anchor(html.unescape(match[3]), module, ids)
        return f"{match[1]}{match[2]}#{html.escape(anchor)}{match[4]}"

    context["body"] = _BACK.sub(fix, context["body"])


def setup(app: Any) -> dict[str, Any]:
    app.connect("viewcode-follow-imported", _viewcode_module)
    app.connect("html-page-context", _fix_backlinks)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
