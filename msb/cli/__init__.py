"""The command line stage: one module per command group (``run``, ``evaluate``, ``report``, ``data``, ``audit``,
``score``, ``metrics``, ``models``, ``weights``, ``contrasts``, ``profile``, ``explain``), the typer app with
``--debug`` and error handling (:mod:`msb.cli.app`), output formats (:mod:`msb.cli.format`) and progress lines
(:mod:`msb.cli.progress`).

It may import every other stage; nothing outside ``msb.cli`` imports it (``msb = "msb.cli:main"``).
"""

from msb.cli.app import main

__all__ = ["main"]
