"""§0, the request state machine: one request's states, who owns what in each, and its one ending.

* :mod:`servelab.lifecycle.state_machine`: the states, their guards, resources and cleanup as data
  (:data:`STATE_TABLE`, :data:`TRANSITIONS`), the guarded :class:`RequestLifecycle`, and the one
  idempotent :func:`reclaim` every terminal path shares; its names are exported here;
* :mod:`servelab.lifecycle.states`: the words the others share (:class:`RequestState`,
  :class:`Resource`);
* :mod:`servelab.lifecycle.ledger`: the terminal records (:class:`Usage`, :class:`TerminalRecord`)
  in a bounded :class:`Ledger`;
* :mod:`servelab.lifecycle.reservation_rules`: the KV admission rule in words, one sentence per
  policy.
"""

# the chapter's names, for ``from servelab import lifecycle``
from servelab.lifecycle.state_machine import *  # noqa: F403
from servelab.lifecycle.state_machine import __all__  # noqa: F401
