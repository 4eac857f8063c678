"""What a vendor's CI adds to a run: the post-processors of a report, in one list.

:mod:`conformance.ci.processors` lists them in the order they apply
(expectations, baseline, the certificate; then the files: JSON, JUnit,
Markdown, HTML, the refreshed manifest); the CLI, ``merge`` and the pytest
plugin call that list, never a post-processor by name.  The options are
declared in :mod:`conformance.ci.options`.  Importing this package imports
nothing else: ``--help`` stays light.

What the post-processors read but the run itself makes stays in the core,
below this package (``tests/test_imports.py``): the documented vLLM defects
(:mod:`conformance.upstream`: a failure is matched to one while the run can
still call vLLM's default builder on its counterexample), what each verdict
rests on and what the containment held (:mod:`conformance.report.trust`:
fields of every report, certified or not), and the integrity layers of the
harness (``harness/integrity.py``, ``answer_plainness.py``,
``native_input_changes.py``: on by default in every run; docs/trust.md).
"""
