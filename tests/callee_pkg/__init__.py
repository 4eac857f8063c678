"""Modules for the static callee rule's unit tests (tests/test_reach.py); never imported."""
