"""HiSparse's invariants: the host pool, the groups and the host runs vLLM's runtime reads.

HiSparse (``PlanningConfig.hisparse``) keeps sparse-MLA source KV in a host
pool beside device caches.  Its invariants are judged on the core's
scenarios (``grouping``, ``core``, ``profiling`` and ``host``) and declared
here: :mod:`~conformance.extensions.hisparse.pool` (``KV-HOST-HISPARSE-POOL``:
the pool's sizing), :mod:`~conformance.extensions.hisparse.groups`
(``KV-GROUP-HISPARSE-*``: roles and hot-buffer blocks) and
:mod:`~conformance.extensions.hisparse.runs` (``KV-HOST-HISPARSE-RUNS``: one
run of pages per source layer).  It adds them to the core through
:data:`conformance.extensions.contributions.CONTRIBUTIONS`, after every core
check module and before the serving simulation's, as before.  Which layers
HiSparse keeps on the host stays in the core
(:func:`conformance.check.residency.hisparse_source_layers`): every host
invariant reads it.
"""
