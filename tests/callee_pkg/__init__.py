"""Modules for the static callee rule's unit tests (tests/extensions/test_reach.py).

Never imported.
"""
