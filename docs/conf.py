"""Sphinx configuration of the documentation site (``sphinx-build -W docs site``; tests/integration/test_docs.py builds it).

Pages are Markdown (MyST); the API reference is generated from the package's numpydoc docstrings
(autodoc + napoleon), whose ``:func:``/``:class:`` roles become links.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # document this checkout, also where another istar is installed

from istar import __version__  # noqa: E402

project = "istar"
author = "The istar contributors"
copyright = "2026, The istar contributors"  # noqa: A001 (Sphinx's name)
version = release = __version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.mathjax"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "figures/README.md"]
myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "none"  # the docstrings' Parameters sections say what each argument is
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False
napoleon_use_ivar = True  # dataclass fields as a field list, as parameters are

html_theme = "pydata_sphinx_theme"
html_title = f"istar {__version__}"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    # the guide's sections are the left column's; the right one would leave its code too narrow
    "secondary_sidebar_items": {"**": ["page-toc"], "library": []},
    "footer_start": ["copyright"],
    "footer_end": [],
}
html_sidebars = {"**": ["sidebar-nav-bs"], "library": ["page-toc"]}
html_static_path = ["_static"]
html_css_files = ["custom.css"]
