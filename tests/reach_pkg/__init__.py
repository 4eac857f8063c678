"""A vendor-style builder package for the reach tests: ordinary models go to ``super()``."""
