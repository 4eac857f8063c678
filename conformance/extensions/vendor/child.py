"""The models child: a vendor's models spec evaluated outside the judging process.

A ``module:attr`` models spec (and a models object given to
``check_builder``) names the vendor's code.  :func:`evaluate` runs it in a
contained child process (:mod:`conformance.harness.confine`: its own PID
namespace, no capability over the judge, no certification key), which
imports the module, calls or draws from what it names
(:func:`conformance.extensions.vendor.models.models_here`), and sends the models back
as a ``kvref-models/1`` document (:mod:`conformance.extensions.vendor.data`).
The judge reads that document as it reads a JSON file, a vendor's spec class
by name only (:func:`conformance.harness.wire.builder_class`): a module that
patches the kit at import patches only the child.  :func:`load_models`,
:func:`models_for_run` and :func:`preload` are how the kit's runs and front
ends load models.

The child is forked where the platform forks and this process holds no
certification key; otherwise it is a fresh interpreter, and an object
(which cannot be sent to one) is evaluated here, as the caller's own code
already runs here.
"""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from conformance.extensions.vendor.models import (
    VendorModelError,
    around,
    models_here,
    read_data,
    read_json,
    spelled,
)
from conformance.extensions.vendor.models import models_for_run as _models_for_run
from conformance.generate.records import Model
from conformance.harness import confine
from conformance.harness.wire import builder_class

__all__ = ["evaluate", "load_models", "models_for_run", "preload", "serve_models"]

#: Seconds the child may take to import, call or draw the vendor's models.
CHILD_SECONDS = 300.0

#: What a ``module:attr`` spec gave, kept for the run that asked first (``keep``).
_EVALUATED: dict[str, Any] = {}


def evaluate(spec: object, *, keep: bool = False) -> list[Model]:
    """The models ``spec`` names, evaluated in a contained child, read back as data.

    ``keep``: keep the data for the next call with this spec (once): the CLI
    evaluates the spec before it touches its outputs, and its run then uses
    those models rather than start the child again.  Every other call
    evaluates afresh: a vendor who edits the module sees the edit.

    Raises:
        VendorModelError: the spec is unusable, the child failed or sent no models.
    """
    where = f"models={spec!r:.200}" if isinstance(spec, str) else "models"
    methods = multiprocessing.get_all_start_methods()
    if not isinstance(spec, str) and ("fork" not in methods or _key_held()):
        # An object cannot reach a fresh interpreter; it is the caller's, already here.
        return models_here(spec)
    data = _EVALUATED.pop(spec, None) if isinstance(spec, str) else None
    if data is None:
        reply = _ask_child(spec, where)
        if "error" in reply:
            raise VendorModelError(str(reply["error"]))
        data = reply.get("ok")
        if keep and isinstance(spec, str):
            _EVALUATED[spec] = data
    return read_data(
        data, f"{where} (as the models child sent it)", what=where, vendor_class=builder_class
    )


def _key_held() -> bool:
    return confine.key_in_memory()


def _is_file(spec: object) -> bool:
    return isinstance(spec, Path) or (
        isinstance(spec, str) and (spec.endswith(".json") or Path(spec).is_file())
    )


def load_models(spec: object, *, keep: bool = False) -> st.SearchStrategy[Model]:
    """A strategy of the vendor's models (and variants around them), for a run of the kit.

    A JSON file is read here (a vendor's spec class by name only); anything
    else is evaluated in a contained child and crosses as data.  ``keep``: the
    next load of this ``module:attr`` spec reuses the data (once).

    Raises:
        VendorModelError: the spec, or a model or spec it names, is unusable.
    """
    if _is_file(spec):
        models = read_json(spec, vendor_class=builder_class)  # type: ignore[arg-type]
    else:
        if isinstance(spec, str):
            spelled(spec)
        models = evaluate(spec, keep=keep)
    return st.one_of([around(m) for m in models])


def models_for_run(
    spec: object | None, *, models_only: bool = False, max_layers: int = 64
) -> st.SearchStrategy[Model] | None:
    """:func:`.models.models_for_run`, the vendor's models read in a contained child.

    Raises:
        VendorModelError: ``spec`` is unusable, or ``models_only`` without a spec.
    """
    return _models_for_run(spec, models_only=models_only, max_layers=max_layers, load=load_models)


def preload(spec: object | None) -> None:
    """Evaluate ``spec`` now (its child runs once; the run reuses the data).

    The CLI calls it before it touches any output file: a bad spec is a
    usage error there, naming the value.

    Raises:
        OptionError: the spec is unusable.
    """
    from conformance.errors import OptionError

    if spec is None:
        return
    try:
        load_models(spec, keep=True)
    except VendorModelError as exc:
        raise OptionError(str(exc)) from None


def _ask_child(spec: object, where: str) -> dict[str, Any]:
    confine.protect_judge()
    forked = "fork" in multiprocessing.get_all_start_methods() and not confine.key_in_memory()
    context: Any = multiprocessing.get_context("fork" if forked else "spawn")
    here, there = context.Pipe()
    process = context.Process(
        target=confine.run_contained,
        args=(there, os.getpid(), f"{__name__}:serve_models", spec),
        name="kvref-models-child",
        daemon=True,
    )
    with confine.without_key():
        process.start()
    there.close()
    facts: dict[str, Any] = {}
    try:
        facts = _message(here, where)
        confine.record("models", facts)
        reply = _message(here, where)
    finally:
        here.close()
        confine.end_chain(process.pid, process.is_alive, facts)
        process.join(5)
        if process.is_alive():
            process.kill()
            process.join(5)
    if not isinstance(reply, dict) or not ({"ok"} == set(reply) or {"error"} == set(reply)):
        raise VendorModelError(f"{where}: the models child sent {reply!r:.200}")
    return reply


def _message(conn: Any, where: str) -> Any:
    try:
        if not conn.poll(CHILD_SECONDS):
            raise VendorModelError(
                f"{where}: evaluating it took over {CHILD_SECONDS:.0f} s (in the models child)"
            )
        return json.loads(conn.recv_bytes())
    except (EOFError, OSError):
        raise VendorModelError(
            f"{where}: the process that evaluated it ended before it sent the models"
        ) from None
    except ValueError as exc:
        raise VendorModelError(f"{where}: the models child sent no data: {exc}") from None


def serve_models(conn: Any, spec: object) -> None:
    """In the contained child: evaluate ``spec`` and send the models as data (or the error)."""
    from conformance.extensions.vendor.data import DataError, models_data

    # What the vendor's code prints is not the kit's output.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    where = f"models={spec!r:.200}" if isinstance(spec, str) else "models"
    try:
        reply: dict[str, Any] = {"ok": models_data(models_here(spec))}
    except (VendorModelError, DataError) as exc:
        reply = {"error": str(exc)}
    except BaseException as exc:  # the vendor's code: any failure is the spec's
        reply = {"error": f"{where}: evaluating it raised {type(exc).__name__}: {exc}"}
    conn.send_bytes(json.dumps(reply).encode())
    conn.close()
    os._exit(0)
