"""What a vendor's CI adds to a run: the post-processors of a report, in one list.

:mod:`conformance.ci.processors` lists them in the order they apply
(expectations, baseline, the certificate; then the files: JSON, JUnit,
Markdown, HTML, the refreshed manifest); the CLI, ``merge`` and the pytest
plugin call that list, never a post-processor by name.  The options are
declared in :mod:`conformance.ci.options`.  Importing this package imports
nothing else: ``--help`` stays light.
"""
