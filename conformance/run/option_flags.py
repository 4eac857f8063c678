"""The flags of a run's options (:class:`~conformance.run.options.RunOptions`), by field.

Kept apart from the record, with nothing but the standard library imported,
so that ``--help`` and the pytest plugin's options (declared in every pytest
session of the environment) import neither attrs nor the kit.  The record
takes each field's flag into its metadata and asserts at import that every
field has one here (:func:`conformance.flags.declared`).  Each help is the
command line's; ``kv`` gives the plugin's where it says less.
"""

from __future__ import annotations

import argparse

from conformance.flags import Flag, Off, flag

__all__ = ["DEFAULT_BUILDER", "PROFILES", "RUN_FLAGS"]

#: The builder the CLI checks when none is named (also in :mod:`conformance.harness.adapters`).
DEFAULT_BUILDER = "kvref:ReferenceKVCacheConfigBuilder"

#: Examples per scenario for each profile.
PROFILES: dict[str, int] = {"ci": 50, "thorough": 500}

RUN_FLAGS: dict[str, Flag | None] = {
    "builder": flag(
        "module:Class, module.Class or path/to/file.py:Class of the builder "
        f"(default: {DEFAULT_BUILDER}); the current directory is on the import path",
        cli={"names": ("builder",), "nargs": "?", "default": DEFAULT_BUILDER},
        kv={"help": "module:Class of the builder to check"},
    ),
    "device": flag(
        "torch device for the device checks",
        cli={"default": "cpu"},
        kv={"help": "torch device for the device checks (cpu)"},
    ),
    "profile": flag(
        "ci (the default: 50 examples per scenario) or thorough (500)",
        cli={"default": "ci", "choices": tuple(PROFILES)},
        kv={"help": "ci (the default) or thorough"},
    ),
    "max_examples": flag(
        "examples per scenario (>= 1)", type=int, kv={"help": "examples per scenario"}
    ),
    "seed": flag(
        "seed of the run (printed in the report)",
        type=int,
        kv={"help": "seed (default: random, in the header)"},
    ),
    "select": flag(
        "comma-separated invariant ids or prefixes (e.g. KV-PLACE,KV-CORE-SLACK)",
        kv={"help": "comma-separated invariant ids or prefixes (as --select)"},
    ),
    # Python's: the front ends read --xfail-file as an expectations manifest.
    "xfail": None,
    "unsupported": flag(
        "comma-separated capabilities the builder lacks (e.g. host_resident)",
        cli={"default": ""},
        kv={"help": "capabilities the builder lacks"},
    ),
    "timeout": flag(
        "per-call deadline, seconds",
        type=float,
        cli={"default": 10.0},
        kv={"help": "per-call deadline, seconds (10)"},
    ),
    "max_alloc_bytes": flag(
        "cap of one device allocation (> 0)", type=int, kv={"help": "cap of one allocation"}
    ),
    "shrink": flag(
        "shrink failures to minimal counterexamples",
        cli=None,
        kv=None,
        off=Off(help="report failures unshrunk"),
    ),
    "database": flag(
        "Hypothesis example database: saved counterexamples are replayed first "
        "(default: .hypothesis/kvref-conformance)",
        cli={"default": ".hypothesis/kvref-conformance"},
        kv={"help": "Hypothesis example database directory: replay and save"},
        off=Off(help="neither replay nor save counterexamples", value=None, kv=None),
    ),
    "models": flag(
        "your own models, mixed into generation: module:attr (a strategy of models, a "
        "callable, a list or dict of models) or a kvref-models/1 JSON file (docs/vendors.md)",
        metavar="SPEC",
        kv={"metavar": None, "help": "your own models (module:attr or a kvref-models/1 JSON file)"},
    ),
    "models_only": flag(
        "generate from --models alone",
        action="store_true",
        kv={"help": "generate from --kv-models alone"},
    ),
    "isolate": flag(
        "run the builder in a worker process: a hook that exits, crashes or patches the "
        "kit is reported as a failure of the builder (default: on; --no-isolate runs it in "
        "the kit's process, e.g. for a debugger)",
        cli={"action": argparse.BooleanOptionalAction, "default": True},
        kv={
            "action": "store_true",
            "help": "run the builder in a worker process, its module imported only there "
            "(the default; a crash or a patch of the kit is the builder's failure)",
        },
        off=Off(
            help="run the builder in pytest's process (debugging only: a builder can then "
            "patch the kit)",
            cli=None,
        ),
    ),
    "reach": flag(
        "comma-separated modules whose lines reach is measured in (default: the "
        "builder's module and package; measured whenever coverage.py is installed)",
        metavar="MODULES",
        kv={"help": "modules reach is measured in"},
        off=Off(help="do not measure reach", contradicts=("reach", "min_reach")),
    ),
    "min_reach": flag(
        "fail (exit 1) when the run executed less of the builder's code than this",
        type=float,
        metavar="PERCENT",
        kv={"help": "fail below this reach"},
    ),
    "replays": flag(
        "replays of each failure's minimal counterexample: deterministic or flaky "
        "(default 2; 0: none)",
        type=int,
        cli={"default": 2},
        kv={"help": "replays of each failure's counterexample (2)"},
    ),
    "worker_memory": flag(
        "GiB of private memory the builder's worker may take over its size at start "
        "(default 16): a hook that leaks past it fails KV-CALL-RAISES",
        type=float,
        metavar="GIB",
        kv={"help": "GiB of memory the builder's worker may take over its start (16)"},
    ),
    "focus": flag(
        "where the run draws its extra examples: learned from where the builder's answers "
        "differ from the reference's (default), 'off', or family=PATH,...;... as a report's "
        "reproduce line gives it",
        metavar="SPEC",
        kv={
            "help": "where the run draws its extra examples: learned (default), 'off', "
            "or a reproduce line's family=PATH,...;..."
        },
    ),
    "explore": flag(
        "after the run, explore for SECONDS: keep examples that reach new lines of the "
        "builder, mutate them, judge each by every invariant; the corpus is saved in the "
        "database and judged first next time (needs reach measured)",
        type=float,
        metavar="SECONDS",
        kv={"help": "seconds of coverage-guided exploration after the run (0: none)"},
    ),
    "explore_candidates": flag(
        "stop exploring after N candidates (reproducible; --explore still limits the time)",
        type=int,
        metavar="N",
        kv={"help": "stop exploring after N candidates"},
    ),
    "shard": flag(
        "judge only the I-th of N shares of the run's model families (one machine of a CI "
        "matrix); needs --focus given; 'kvref-conformance merge' joins the N --json reports",
        metavar="I/N",
        kv=None,
    ),
    "vllm": flag(
        "the vLLM release whose contract the run judges: 0.33, 0.34, or all (the "
        "compatibility matrix, one run per release); default: the installed vLLM when "
        "supported, else the newest",
        metavar="VERSION",
        kv={
            "help": "the vLLM release whose contract the run judges (0.33 or 0.34; default: "
            "the installed vLLM when supported, else the newest)"
        },
    ),
}
