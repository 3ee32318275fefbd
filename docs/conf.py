"""Sphinx configuration for gameopt's documentation.

Build (strict: any warning, unresolved cross-reference, broken internal link, page that
loads a script or stylesheet from the network, or missing API entry fails; the last three
are docs/build_checks.py's):

    python3 -m sphinx -W --keep-going -n -b html docs docs/_build/html
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DOCS))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import api_page  # noqa: E402

import gameopt  # noqa: E402

project = "gameopt"
author = "the gameopt authors"
copyright = "gameopt authors"
release = version = gameopt.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx-mathjax-offline",  # MathJax from the build's _static/mathjax, not from a CDN
    "sphinx.ext.viewcode",
    "viewcode_links",  # docs/viewcode_links.py: viewcode's links to builtins.html and wrong anchors fixed
    "myst_parser",
    "sphinx_gallery.gen_gallery",
    "build_checks",  # docs/build_checks.py: no network loads, no broken links, every API entry
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
# sg_execution_times.rst: left by older builds (computation times, which load from CDNs, are off)
exclude_patterns = [
    "_build",
    "sg_execution_times.rst",
    "auto_examples/sg_execution_times.rst",
    "examples/README.txt",
    "examples/*.py",
    "**.ipynb_checkpoints",
]
templates_path = ["_templates"]

# strict: -W -n on the command line; these are the references Sphinx cannot resolve
# without network access to other projects' inventories (torch, numpy, scipy)
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(torch|numpy|np|scipy|matplotlib|collections|typing|pathlib|lightning)(\..*)?"),
    (r"py:.*", r"nn\..*"),
    (r"py:.*", r"(Optimizer|FlatParameter|Tensor|Module|Parameter|LinearOperator|Axes|Figure|Generator|ndarray|Path)"),
    (r"py:.*", r"(Any|Callable|Iterable|Iterator|Sequence|Mapping|MutableMapping|Self|Literal|TypeVar|ParamSpec)"),
    (r"py:.*", r"(int|float|bool|str|dict|list|tuple|object|None|type|bytes|optional|callable)"),
    (r"py:.*", r"gameopt\..*\.(State|Losses|Empty|T|P|S|Vecs|Spec)"),
    (r"py:.*", r"gameopt\.(layout\.Entry|player\.RegistryWatch)"),  # internal types in signatures
    (r"py:.*", r"(PieceViews|Along)"),  # (a layout's views for gameopt.vec.Pieces; xi's (direction, factors))
    (r"py:func", r"backward"),  # torch.Tensor.grad's docstring, inherited by FlatParameter
    (r"py:.*", r"(ObjectiveAndConstraints|State|Losses|Empty|Vecs|Spec|S|Step)"),
    (r"py:.*", r"(Linearizable|OracleInterface|GameView|Steppable|JointLayout)"),
    (r"py:class", r"gameopt\..*\._[A-Za-z]\w*"),  # private bases (_Sequential): undocumented
]

# API reference
autosummary_generate = True
autosummary_imported_members = False
autodoc_default_options = {"members": True, "show-inheritance": False, "member-order": "bysource"}
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented_params"
autodoc_class_signature = "mixed"
autodoc_preserve_defaults = True
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

# Markdown pages
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3

# the gallery: every docs/examples/plot_*.py is executed at build time and shown with its figures
sphinx_gallery_conf = {
    "examples_dirs": "examples",
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"/plot_",
    "ignore_pattern": r"__init__\.py",
    "download_all_examples": False,
    "remove_config_comments": True,
    "abort_on_example_error": True,
    "only_warn_on_example_error": False,
    "matplotlib_animations": False,
    "within_subsection_order": "FileNameSortKey",
    "reset_modules": ("matplotlib",),
    "show_memory": False,
    "show_signature": False,
    # its execution-time pages load jQuery and DataTables from CDNs (build_checks refuses that)
    "write_computation_times": False,
}

html_theme = "furo"
html_title = f"gameopt {version}"
html_static_path: list[str] = []
html_theme_options = {"navigation_with_keys": True}
suppress_warnings: list[str] = []


api_page.write(DOCS / "api" / "index.rst")  # from gameopt.__all__: every public name documented
