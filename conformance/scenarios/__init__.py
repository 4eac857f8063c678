"""The scenarios: how each one draws its examples and observes a builder, in one registry."""
