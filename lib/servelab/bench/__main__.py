"""``python -m servelab.bench``: the engine benchmark (:func:`servelab.bench.engine_bench.main`)."""

from servelab.bench.engine_bench import main

main()
