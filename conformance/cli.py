"""``kvref-conformance``: run the kit against a builder and print a report.

Exit status: 0 when every selected invariant was judged and held, 1 when one
failed or could not be judged, 2 for a usage error (unknown builder, bad
option, a builder that cannot be constructed, an output path that cannot be
written), 130 when interrupted by Ctrl-C (SIGINT) and 143 (128 + 15) when
terminated by SIGTERM, what a CI timeout sends (either way the partial report
is still printed and written), so a vendor's CI can gate on it.

The header (builder, seed, options) is printed before the first example, and
``--json`` / ``--junit`` files are replaced by an "incomplete" marker at the
start: a run killed outright (SIGKILL) still shows how to rerun it and leaves
no stale report of an earlier run behind.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from conformance.cli_parser import parser as _parser
from conformance.errors import KitError
from conformance.harness.allocator_settings import keep_freed_memory, settle_startup_objects
from conformance.harness.integrity import keep_guarding

__all__ = ["main"]


class _UsageError(Exception):
    pass


class _Progress:
    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.last = ""
        self.last_done = -1
        self.started = time.perf_counter()

    def __call__(self, scenario: str, done: int, total: int) -> None:
        width = 30
        filled = width * done // max(total, 1)
        line = (
            f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} examples "
            f"({scenario}, {time.perf_counter() - self.started:.0f}s)"
        )
        if self.tty:
            # Clear to the end of the line: a shorter line must not leave stale text.
            self.stream.write("\r" + line + "\x1b[K")
            self.stream.flush()
        elif scenario != self.last or (done == total and self.last_done != done):
            # A log gets one line per scenario and one at its end, never a line per
            # example: the focus's examples past the first deal stay at ``total``.
            self.stream.write(line + "\n")
        self.last, self.last_done = scenario, done

    def close(self) -> None:
        if self.tty:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


#: Whether the process is the console script's own (set by :func:`entry`), not a caller's.
_PROCESS = {"own": False}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status."""
    verb = _reports_verb(argv)
    if verb is not None:
        return verb
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return 0 if exc.code == 0 else 2
    previous = _catch_ctrl_c()
    previous_term = _catch_sigterm()
    unraisable = sys.unraisablehook
    if previous is not None:
        sys.unraisablehook = _quiet_dropped_ctrl_c(unraisable)
    try:
        return _run(args)
    except _UsageError as exc:
        print(f"kvref-conformance: error: {exc}", file=sys.stderr)
        return 2
    except KitError as exc:
        # No verdict: the kit's own code failed, not the builder.
        detail = exc.detail or "".join(traceback.format_exception(exc))
        print(f"kvref-conformance: {exc}\n{detail.rstrip()}\n{exc.hint}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # Ctrl-C before the run started or while the report was written; a
        # run in progress is stopped by the runner, which keeps what it found.
        print(f"kvref-conformance: {_stopped_by()}", file=sys.stderr)
        return _interrupted_status()
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
        if previous_term is not None:
            signal.signal(signal.SIGTERM, previous_term)
        sys.unraisablehook = unraisable


class _Stop:
    """Which signal stopped the run (the exit status says it)."""

    terminated = False
    #: The process whose handlers these are: a forked worker inherits them.
    pid = 0


def _interrupted_status() -> int:
    """130 for Ctrl-C, 143 for SIGTERM: the statuses a shell gives a process those signals end."""
    return 143 if _Stop.terminated else 130


def _stopped_by() -> str:
    return "terminated (SIGTERM)" if _Stop.terminated else "interrupted"


def _on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM (a CI timeout) ends the run as Ctrl-C does: partial report, then exit 143."""
    if os.getpid() != _Stop.pid:
        # A worker forked from the kit inherits this handler: the kit, not the
        # worker, ends the run, and a worker that died here would read as a
        # crash of the builder.
        return
    _Stop.terminated = True
    _on_ctrl_c(signum, frame)


def _catch_sigterm() -> Any:
    """Install :func:`_on_sigterm`; returns the handler it replaced (``None``: none installed)."""
    _Stop.terminated = False
    if threading.current_thread() is not threading.main_thread():
        return None  # only the main thread may set handlers
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return None  # ignored, or handled by whoever embeds us
    _Stop.pid = os.getpid()
    return signal.signal(signal.SIGTERM, _on_sigterm)


def _on_ctrl_c(signum: int, frame: object) -> None:
    from conformance.harness.guard import note_interrupt

    # Raised where the signal lands; if Python drops it there (a gc callback),
    # the kit raises it again at its next call into the builder.
    note_interrupt()
    raise KeyboardInterrupt


def _quiet_dropped_ctrl_c(previous: Callable[[Any], object]) -> Callable[[Any], None]:
    """An unraisable-exception hook that keeps quiet about a dropped Ctrl-C.

    Python reports an exception it cannot raise (in a gc callback or a
    ``__del__``) as "Exception ignored in ...": for Ctrl-C that is no error,
    since the kit raises it again (see :func:`_on_ctrl_c`).
    """

    def hook(unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            return
        previous(unraisable)

    return hook


def _catch_ctrl_c() -> Any:
    """Install :func:`_on_ctrl_c` for SIGINT; returns the handler it replaced (``None``: none)."""
    from conformance.harness.guard import clear_interrupt

    clear_interrupt()
    if threading.current_thread() is not threading.main_thread():
        return None  # only the main thread may set handlers
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return None  # Ctrl-C ignored (a background job) or handled by whoever embeds us
    return signal.signal(signal.SIGINT, _on_ctrl_c)


def _list() -> int:
    from conformance.check.catalog import catalog

    for inv in catalog():
        scenarios = "every" if inv.everywhere else ",".join(inv.scenarios)
        print(f"{inv.id:28} {scenarios:16} {inv.title}  [{inv.reference}]")
    return 0


def _start_outputs(args: argparse.Namespace, start: Any) -> None:
    """Open every output path for writing now, leaving an "incomplete" marker in it.

    Opening is the only honest test of writability (``os.access`` misjudges
    ACLs, read-only mounts and root), and the marker replaces whatever file
    was there: a stale or planted report never survives a run.  The final
    report overwrites the marker.
    """
    from conformance.ci.junit import write_incomplete_junit
    from conformance.report.render import write_incomplete_json

    outputs = [
        (option, path, write)
        for option, path, write in (
            ("--json", args.json, write_incomplete_json),
            ("--junit", args.junit, write_incomplete_junit),
        )
        if path is not None
    ]
    for option, path, _ in outputs:
        if path.is_dir():
            raise _UsageError(f"{option} {str(path)!r} is a directory, not a file path")
        parent = path.parent if str(path.parent) else Path()
        if not parent.is_dir():
            raise _UsageError(
                f"{option} {str(path)!r}: the directory {str(parent)!r} does not exist"
            )
    created: list[Path] = []
    for option, path, write in outputs:
        existed = path.exists()
        try:
            write(start, path)
        except OSError as exc:
            # A usage error leaves no new file behind (a replaced one stays a marker).
            for made in created:
                made.unlink(missing_ok=True)
            raise _UsageError(
                f"{option} {str(path)!r} cannot be written: {exc.strerror or exc}"
            ) from None
        if not existed:
            created.append(path)


def _header_options(args: argparse.Namespace) -> tuple[str, ...]:
    """The options that shape the run besides the header's own, as command-line words."""
    import shlex

    words: list[str] = []
    for flag, value in (
        ("--select", args.select),
        ("--unsupported", args.unsupported or None),
        ("--xfail-file", args.xfail_file),
        *(("--expectations", spec) for spec in args.expectations),
        ("--update-expectations", args.update_expectations),
        ("--baseline", args.baseline),
        ("--replays", args.replays),
        ("--markdown", args.markdown),
        ("--max-alloc-bytes", args.max_alloc_bytes),
        ("--models", args.models),
        ("--reach", args.reach),
        ("--min-reach", args.min_reach),
        ("--worker-memory", args.worker_memory),
        ("--focus", args.focus),
        ("--explore", args.explore),
        ("--explore-candidates", args.explore_candidates),
        ("--shard", args.shard),
        ("--json", args.json),
        ("--junit", args.junit),
        ("--html", args.html),
    ):
        if value is not None:
            words += [flag, str(value)]
    words += ["--timeout", f"{args.timeout:g}", "--isolate" if args.isolate else "--no-isolate"]
    words += ["--no-database"] if args.no_database else ["--database", str(args.database)]
    for flag, on in (
        ("--models-only", args.models_only),
        ("--no-shrink", args.no_shrink),
        ("--no-reach", args.no_reach),
        ("--certify", args.certify),
    ):
        if on:
            words.append(flag)
    return tuple(shlex.quote(w) for w in words)


def _run(args: argparse.Namespace) -> int:
    if args.list:
        return _list()
    # As `python -m` does: a vendor's builder module in the current directory imports.
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    from conformance.extensions.vendor.child import preload as preload_models
    from conformance.harness.adapters import BuilderLoadError, load_builder
    from conformance.run.options import ALL_RELEASES, OptionError, flag_message
    from conformance.run.runner import check_options

    # First: a --certify run fixes the command line's seed and profile here.
    ci = _ci_inputs(args)
    try:
        options = _options(args)
        # The device too: refused before any output file is touched.
        check_options(options, one_release=options.vllm != ALL_RELEASES)
        _matrix_refusals(args, options)
        # In their contained child, before any output file is touched (docs/trust.md).
        preload_models(options.models)
    except OptionError as exc:
        raise _UsageError(flag_message(str(exc))) from None
    # Resolved in the options, not in check_builder: the header printed before
    # the first example, and the incomplete outputs, must already name them.
    args.seed, args.max_examples, args.vllm = options.seed, options.max_examples, options.vllm
    _start_outputs(args, _run_start(args))
    if args.isolate:
        # By name: the builder's module is imported only in its worker process.
        return _check(args, args.builder, ci, options)
    try:
        builder = load_builder(args.builder)
    except BuilderLoadError as exc:
        raise _UsageError(str(exc)) from None
    return _check(args, builder, ci, options)


def _options(args: argparse.Namespace, xfail: Sequence[str] = ()) -> Any:
    """The run's one :class:`~conformance.run.options.RunOptions`, from the command line.

    Read by the flags the record's fields declare (:mod:`conformance.flags`):
    an option not given is ``None`` here and takes the kit's default there;
    the CLI's one deliberate difference is the example database, saved to
    ``.hypothesis/kvref-conformance`` unless ``--no-database``.  ``xfail``:
    ids expected to fail, as Python gives them (``--xfail-file`` is read as an
    expectations manifest instead: :mod:`conformance.ci.processors`).

    Raises:
        OptionError: an option that cannot be read (``--no-reach`` with ``--reach``).
    """
    from conformance.flags import CLI, read_values
    from conformance.run.option_flags import RUN_FLAGS
    from conformance.run.options import RunOptions

    values = read_values([RUN_FLAGS], CLI, lambda dest: getattr(args, dest))
    return RunOptions.create(values.pop("builder"), xfail=xfail, **values)


def _ci_inputs(args: argparse.Namespace) -> Any:
    """The inputs of the CI post-processors, validated before any example runs."""
    from conformance.ci.processors import CiError, prepare_from

    try:
        return prepare_from(args)
    except CiError as exc:
        raise _UsageError(str(exc)) from None


def _run_start(args: argparse.Namespace) -> Any:
    from conformance.report.render import RunStart

    return RunStart(
        builder=args.builder,
        device=args.device,
        seed=args.seed,
        profile=args.profile,
        max_examples=args.max_examples,
        options=_header_options(args),
        contract=f"vLLM {args.vllm}",
    )


def _matrix_refusals(args: argparse.Namespace, options: Any) -> None:
    """Refuse, before the run, what a compatibility matrix (``--vllm all``) cannot honour.

    Raises:
        OptionError: an option that makes sense for one release's report only.
    """
    from conformance.run.options import ALL_RELEASES, OptionError

    if options.vllm != ALL_RELEASES:
        return
    for flag, given in (
        ("--baseline", args.baseline),
        ("--update-expectations", args.update_expectations),
        ("--certify", args.certify),
        ("--shard", args.shard),
    ):
        if given:
            raise OptionError(
                f"vllm=all makes one report per release; {flag} applies to one release's "
                "report: run it with --vllm 0.33 or --vllm 0.34"
            )


def _check_matrix(args: argparse.Namespace, builder: object, ci: Any, options: Any) -> int:
    """``--vllm all``: the compatibility matrix (one run per supported release)."""
    import attrs

    from conformance.ci.matrix import check_matrix, format_matrix, write_matrix_files
    from conformance.ci.processors import finish
    from conformance.run.runner import check_builder

    def run(b: Any, o: Any, **overrides: Any) -> Any:
        release = overrides["vllm"]
        print(f"== vLLM {release}", file=sys.stderr, flush=True)
        report = check_builder(b, attrs.evolve(o, vllm=release), progress=_Progress(sys.stderr))
        return finish(report, ci)

    matrix = check_matrix(builder, options, run=run)
    print(format_matrix(matrix))
    errors = write_matrix_files(
        matrix, json_path=args.json, junit=args.junit, markdown=args.markdown, html_path=args.html
    )
    for error in errors:
        print(f"kvref-conformance: error: {error}", file=sys.stderr)
    if errors:
        return 2
    return 0 if matrix.ok else 1


def _check(args: argparse.Namespace, builder: object, ci: Any, options: Any) -> int:
    import datetime

    import attrs

    from conformance.ci.processors import CiError, exit_status, finish, write_outputs
    from conformance.report.render import format_header, format_report
    from conformance.run.options import OptionError, flag_message
    from conformance.run.runner import check_builder
    from kvref.interop.vllm_convert import keep_vllm_quiet

    if _PROCESS["own"]:
        # The console script's process only checks builders: vLLM's logger stays quiet.
        keep_vllm_quiet()
        settle_startup_objects()
    from conformance.run.options import ALL_RELEASES

    if options.vllm == ALL_RELEASES:
        return _check_matrix(args, builder, ci, options)
    # Before the first example: a run killed outright still shows how to rerun it.
    print(format_header(_run_start(args)), flush=True)
    progress = _Progress(sys.stderr)
    restore = _hypothesis_storage(args.no_database)
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    try:
        report = check_builder(builder, options, progress=progress)  # type: ignore[arg-type]
    except OptionError as exc:
        raise _UsageError(flag_message(str(exc))) from None
    finally:
        progress.close()
        restore()
    try:
        report = finish(attrs.evolve(report, started=started), ci)
    except CiError as exc:
        raise _UsageError(str(exc)) from None
    for warning in report.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(format_report(report, header=False))
    # Checked before the run, yet gone or full now: say so, write the others.
    errors = write_outputs(report, ci)
    for error in errors:
        print(f"kvref-conformance: error: {error}", file=sys.stderr)
    if report.interrupted:
        return _interrupted_status()
    if errors:
        return 2
    return exit_status(report, ci)


def _hypothesis_storage(no_database: bool) -> Callable[[], None]:
    """With ``--no-database``, point Hypothesis' own storage at a temporary directory.

    Besides the example database, Hypothesis caches data under ``./.hypothesis``
    (constants it collects from local source files); a run asked to save
    nothing leaves nothing in the working directory.  ``HYPOTHESIS_STORAGE_DIRECTORY``
    set by the user wins.  Returns what undoes it (:func:`main` may run in a
    longer-lived process, a test session say, whose storage must come back).
    """
    if not no_database or os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
        return lambda: None
    import tempfile

    from hypothesis.configuration import set_hypothesis_home_dir, storage_directory

    previous = storage_directory(intent_to_write=False).home_directory
    storage = tempfile.TemporaryDirectory(prefix="kvref-conformance-")
    set_hypothesis_home_dir(storage.name)

    def restore() -> None:
        set_hypothesis_home_dir(previous)
        storage.cleanup()

    return restore


def _reports_verb(argv: Sequence[str] | None) -> int | None:
    """Run a subcommand named by the first word (``verify``, ``merge``); ``None``: not one."""
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["verify"]:
        from conformance.ci.certify import verify_main

        return verify_main(words[1:])
    if words[:1] == ["merge"]:
        from conformance.ci.merge import merge_main

        return merge_main(words[1:])
    return None


def entry() -> None:
    """Console-script entry: exit with :func:`main`'s status, whatever threads a builder left.

    ``kill -USR1 <pid>`` prints every thread's stack to stderr (the run goes
    on): what a builder, or the kit, is waiting on when a run seems stuck.
    """
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    _PROCESS["own"] = True
    # The console script's process is the kit's own: tune its allocator (allocator_settings.py),
    # and once a run has guarded its imports, guard them to the end (reports
    # are written, and their writers imported, after the run: integrity.py).
    keep_freed_memory()
    keep_guarding()
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    if status in (130, 143) or any(
        t.is_alive() and not t.daemon
        for t in threading.enumerate()
        if t is not threading.main_thread()
    ):
        # A builder started a non-daemon thread, or Ctrl-C/SIGTERM cut a hook call short
        # (Python 3.11 then marks its running thread stopped); the run is over and
        # reported, so wait for nothing at interpreter exit.
        os._exit(status)
    sys.exit(status)


if __name__ == "__main__":  # pragma: no cover
    entry()
