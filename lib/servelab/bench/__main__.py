"""``python -m servelab.bench``: the engine benchmark (:func:`servelab.bench.cli.main`)."""

from servelab.bench.cli import main

main()
