"""A run's optional mechanisms.

Each is an :class:`~conformance.extensions.base.Extension` of hooks, or adds
scenarios and invariants to the core (:mod:`conformance.extensions.contributions`).
"""
