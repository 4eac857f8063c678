"""A run's optional mechanisms, each an :class:`~conformance.extensions.base.Extension`."""
