"""The device checks: the builder's configs materialised on the run's torch device.

The ``device`` scenario (:mod:`~conformance.extensions.device.scenario`)
judges placement's calls again, by allocating each config the way vLLM's
worker does and reading it back (:mod:`~conformance.extensions.device.checks`:
allocation sizes, views, tags written through every layer's view, the
device's memory; :mod:`~conformance.extensions.device.kernel`: what
attention kernels read).  Its invariants (``KV-DEV-*``) are declared in
:mod:`~conformance.extensions.device.rows` and
:mod:`~conformance.extensions.device.kernel`; it adds them to the core
through :data:`conformance.extensions.contributions.CONTRIBUTIONS`.
"""
