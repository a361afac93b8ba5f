"""Figures and tables for the course, one module per chapter topic.

:mod:`servelab.viz.core` holds what every chapter shares (showing a figure in the static book, in
Jupyter and on Colab; precomputed slider figures; tables; live controls with a static twin). The
topic modules (``lifecycle``, ``sampling``, ``metrics``, ...) each draw one chapter's figures from
the library's own results and are imported by name, e.g. ``from servelab.viz import lifecycle``.
"""

from servelab.viz.core import live_controls, publish, show, slider_figure, table

__all__ = ["live_controls", "publish", "show", "slider_figure", "table"]
