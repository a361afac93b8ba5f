"""§2, measuring a server and sizing one: latency metrics, roofline, capacity, simulated load.

* :mod:`servelab.metrics.latency`: TTFT, ITL, TPOT, throughputs, SLO attainment, goodput,
  percentiles with their sample size; its names are exported here
  (``from servelab import metrics``);
* :mod:`servelab.metrics.roofline`: which ceiling, bandwidth or compute, bounds a forward pass;
* :mod:`servelab.metrics.capacity`: every worked number of memory, replicas, cost and speculative
  decoding as a function of its assumptions;
* :mod:`servelab.metrics.loadsim`: simulated servers on a simulated clock (load sweeps, coordinated
  omission).
"""

# the chapter's names, for ``from servelab import metrics``
from servelab.metrics.latency import *  # noqa: F403
from servelab.metrics.latency import __all__  # noqa: F401
