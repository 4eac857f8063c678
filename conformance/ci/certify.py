"""Certified runs (``--certify``) and their check (``kvref-conformance verify REPORT``).

A certified run is the kit's own fixed run: the ``thorough`` profile at the
kit's fixed seed (:data:`SEED`), every invariant, no expectations, no
capability declared unsupported, the builder isolated in its worker.  Its
JSON report carries a ``certificate``: the builder's source files and their
sha256, the kit's version, the contract, the device, torch's version, and a
digest of the whole report.

What the digest proves (docs/vendors.md, "Certified runs"; docs/trust.md):
with no key it is a plain sha256 of the report's canonical JSON, so
:func:`verify` detects a report edited by accident or by a tool that did not
recompute it (a verdict changed, a result dropped).  Anyone can recompute a
plain sha256: it is no signature.  With :data:`KEY_ENV` set (a secret of the
vendor's CI), the digest is an HMAC-SHA256 under that key, and only a holder
of the key can make one that verifies: :func:`verify` with a key refuses
every report not signed with it, a plain sha256 included.  A signature others
can check without the secret needs a signing tool (gpg, sigstore) over the
JSON file.

The key never reaches a process that runs the builder's code: the kit
starts every such process without it, and while it holds one starts them
afresh, never forked from its own memory (:mod:`conformance.harness.confine`).  The builder's
files are found in a contained child process that imports the builder
(:func:`builder_files`): the builder's code never runs in the kit's process.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from conformance.harness import confine
from conformance.report.model import Report

__all__ = [
    "CERTIFICATE_FORMAT",
    "KEY_ENV",
    "PROFILE",
    "SEED",
    "CertifyError",
    "CertifyInputs",
    "Verification",
    "VerifyInputError",
    "builder_files",
    "named_module_file",
    "certify_args",
    "file_hashes",
    "report_digest",
    "seal",
    "verify",
    "verify_main",
]

#: The ``format`` of a report's ``certificate``.
CERTIFICATE_FORMAT = "kvref-certificate/1"
#: The profile of a certified run.
PROFILE = "thorough"
#: The seed of every certified run: two certified runs of one builder draw the same examples.
SEED = 20330
#: Examples per scenario; ``None``: the profile's.  Tests set it small (the real run is long).
EXAMPLES: int | None = None
#: The environment variable whose value, when set, keys the digest (HMAC-SHA256).
KEY_ENV = confine.KEY_ENV
#: Seconds the child process that lists the builder's files may take.
_FILES_TIMEOUT = 300.0

#: What a certified run refuses: ``(argument, flag)``; an option not set is ``None``/``False``.
_CONFLICTS: tuple[tuple[str, str], ...] = (
    ("select", "--select"),
    ("unsupported", "--unsupported"),
    ("xfail_file", "--xfail-file"),
    ("expectations", "--expectations"),
    ("update_expectations", "--update-expectations"),
    ("baseline", "--baseline"),
    ("seed", "--seed"),
    ("max_examples", "--max-examples"),
    ("models_only", "--models-only"),
    # A shard is part of a run (issue 20, item 5), not the whole certified one.
    ("shard", "--shard"),
)


class CertifyError(ValueError):
    """A certified run cannot be made as asked; names the option (a usage error, exit 2)."""


@attrs.frozen(kw_only=True)
class CertifyInputs:
    """What a certified run knows before its first example.

    Attributes:
        builder: the builder's importable name.
        root: the directory relative file paths are written from (the current one).
        files: the builder's source files and their sha256 (:func:`file_hashes`).
    """

    builder: str
    root: Path
    files: tuple[dict[str, Any], ...]


def _is_set(args: argparse.Namespace, name: str) -> bool:
    value = getattr(args, name, None)
    return value not in (None, False, "", [], ())


def certify_args(args: argparse.Namespace) -> CertifyInputs:
    """Check a ``--certify`` command line, fix its run, and hash the builder's files.

    Sets ``args.profile``, ``args.seed``, ``args.max_examples`` and
    ``args.no_database`` to the certified run's.  Call it before the run's options are resolved.

    Raises:
        CertifyError: an option that would weaken or narrow the run was given,
            isolation is off, no ``--json`` path is given, or the builder's
            files cannot be found.
    """
    from conformance.run.options import PROFILES

    for name, flag in _CONFLICTS:
        if _is_set(args, name):
            raise CertifyError(
                f"--certify cannot be combined with {flag}: a certified run is the kit's fixed "
                f"run (profile {PROFILE}, seed {SEED}, every invariant, no expectations)"
            )
    if not args.isolate:
        raise CertifyError(
            "--certify cannot be combined with --no-isolate: a certified builder runs in its "
            "worker process, where it cannot patch the kit"
        )
    if args.json is None:
        raise CertifyError("--certify needs --json REPORT.json: the certificate is in that file")
    args.profile = PROFILE
    args.seed = SEED
    args.max_examples = EXAMPLES if EXAMPLES is not None else PROFILES[PROFILE]
    # The seed's examples alone: counterexamples saved by earlier runs would make two
    # certified runs of one builder draw different inputs.
    args.no_database = True
    root = Path.cwd()
    # The named module's file is found without running any code: a builder that lies
    # about its files in the child process cannot keep that one out of the certificate.
    named = named_module_file(args.builder)
    files = builder_files(args.builder) + ([] if named is None else [named])
    return CertifyInputs(builder=args.builder, root=root, files=tuple(file_hashes(files, root)))


def named_module_file(name: str) -> Path | None:
    """The source file of the module a builder's name names, found without importing anything.

    ``path/to/file.py:Class`` names its file; ``pkg.mod:Class`` is looked up
    on ``sys.path`` package by package (the packages' ``__init__`` are not
    run).  ``None``: not a ``.py`` source the path finder can locate.
    """
    import importlib.machinery

    module = name.rpartition(":")[0] if ":" in name else name.rpartition(".")[0]
    if module.endswith(".py"):
        path = Path(module)
        return path.resolve() if path.is_file() else None
    if not module:
        return None
    locations: list[str] | None = [os.getcwd(), *sys.path]
    spec = None
    parts = module.split(".")
    for i in range(len(parts)):
        try:
            spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: i + 1]), locations)
        except (ImportError, ValueError):
            return None
        if spec is None:
            return None
        locations = list(spec.submodule_search_locations or [])
    origin = None if spec is None else spec.origin
    return Path(origin).resolve() if origin and origin.endswith(".py") else None


def builder_files(name: str, *, timeout: float = _FILES_TIMEOUT) -> list[Path]:
    """The builder's source files: the modules reach counts as its own code.

    They are :func:`conformance.harness.reach.builder_modules` of the loaded
    builder, found in a child process (importing the builder runs its code).

    Raises:
        CertifyError: the builder cannot be loaded there, or it took too long.
    """
    confine.protect_judge()
    try:
        # Contained as the worker is, and without the key (conformance.harness.confine).
        proc = subprocess.run(
            [sys.executable, "-m", "conformance.harness.confine", f"{__name__}:files_main", name],
            capture_output=True,
            timeout=timeout,
            check=False,
            env=confine.child_environment(),
            start_new_session=True,
        )
    except subprocess.TimeoutExpired:
        raise CertifyError(
            f"--certify: listing the files of builder {name!r} took over {timeout:g}s"
        ) from None
    # After the containment's frame; the builder may print at import: the list is the last line.
    _, out = confine.split_frame(proc.stdout)
    last = out.decode("utf-8", "replace").rstrip("\n").rpartition("\n")[2]
    try:
        files = json.loads(last) if proc.returncode == 0 else None
    except json.JSONDecodeError:
        files = None
    if not isinstance(files, list) or not files:
        error = proc.stderr.decode("utf-8", "replace")
        detail = error.strip().splitlines()[-1:] or ["no files found"]
        raise CertifyError(f"--certify: the files of builder {name!r}: {detail[0]}")
    return [Path(f) for f in files]


def files_main(argv: Sequence[str]) -> None:
    """The child of :func:`builder_files`: print the builder's files as the last line (JSON)."""
    from conformance.harness.adapters import load_builder
    from conformance.harness.reach import builder_modules

    files = builder_modules(load_builder(argv[0]))
    sys.stdout.write("\n" + json.dumps([str(f) for f in files]) + "\n")
    sys.stdout.flush()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def file_hashes(paths: Sequence[Path], root: Path) -> list[dict[str, Any]]:
    """``{"path", "sha256", "bytes"}`` per file; paths under ``root`` are written relative to it.

    Relative paths let another checkout of the same sources verify the report.
    """
    out = []
    for path in sorted({p.resolve() for p in paths}):
        try:
            shown = str(path.relative_to(root.resolve()))
        except ValueError:
            shown = str(path)
        out.append({"path": shown, "sha256": _sha256(path), "bytes": path.stat().st_size})
    return out


def _device(device: str) -> dict[str, Any]:
    import platform

    import torch

    name = platform.processor() or platform.machine()
    if device.startswith("cuda") and torch.cuda.is_available():
        name = torch.cuda.get_device_name(torch.device(device))
    return {
        "device": device,
        "device_name": name,
        "torch": str(torch.__version__),
        "python": platform.python_version(),
    }


def _canonical(data: Mapping[str, Any]) -> bytes:
    # Through JSON first: what is hashed is what a reader of the file loads.
    plain = json.loads(json.dumps(data, default=str))
    plain["certificate"]["digest"]["value"] = None
    return json.dumps(plain, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def report_digest(data: Mapping[str, Any], key: bytes | None) -> str:
    """The digest of a certified report's JSON data, its own ``digest.value`` left out.

    sha256 of the canonical JSON (sorted keys, no spaces, ASCII), or HMAC-SHA256
    under ``key``.
    """
    canonical = _canonical(data)
    if key is None:
        return hashlib.sha256(canonical).hexdigest()
    return hmac.new(key, canonical, hashlib.sha256).hexdigest()


def _key() -> bytes | None:
    return confine.held_key()


def _containment_problem(containment: Mapping[str, Any] | None) -> str | None:
    """Why the run's verdict or key could have been reached by the builder (``None``: not)."""
    if not containment:
        return "the builder did not run in a contained worker"
    for role, facts in sorted(containment.get("roles", {}).items()):
        if facts.get("judge_memory") != "refused":
            return (
                f"the builder's {role} process could open the judging process's memory "
                f"({facts.get('judge_memory')}) on this platform"
            )
        if facts.get("certify_key") != "absent":
            return f"the builder's {role} process held a copy of {KEY_ENV}"
    return None


def seal(report: Report, inputs: CertifyInputs) -> Report:
    """``report`` with its certificate: the builder's files hashed again, and the digest.

    Raises:
        CertifyError: a builder file changed or went while the run ran (the
            run judged code other than the hashed one), or the containment did
            not hold (a builder process could open the judge's memory or held
            the key: docs/trust.md).
    """
    from conformance.report.render import _kit_version, report_to_dict

    now = file_hashes([inputs.root / f["path"] for f in inputs.files], inputs.root)
    if now != list(inputs.files):
        raise CertifyError(
            "--certify: the builder's source files changed during the run; no certificate"
        )
    problem = _containment_problem(report.containment)
    if problem is not None:
        raise CertifyError(f"--certify: {problem}; no certificate (docs/trust.md)")
    key = _key()
    certificate: dict[str, Any] = {
        "format": CERTIFICATE_FORMAT,
        "conformant": report.ok,
        "builder": inputs.builder,
        "files": [dict(f) for f in inputs.files],
        "kit_version": _kit_version(),
        "contract": report.contract,
        **_device(report.device),
        "profile": report.profile,
        "seed": report.seed,
        "max_examples": report.max_examples,
        "digest": {"algorithm": "sha256" if key is None else "hmac-sha256", "value": None},
    }
    sealed = attrs.evolve(report, certificate=certificate)
    value = report_digest(report_to_dict(sealed), key)
    return attrs.evolve(
        sealed, certificate={**certificate, "digest": {**certificate["digest"], "value": value}}
    )


# ---------------------------------------------------------------------------
# verification


class VerifyInputError(ValueError):
    """The file to verify cannot be read as a report; names the file (exit 2)."""


@attrs.frozen(kw_only=True)
class Verification:
    """What :func:`verify` found.

    Attributes:
        valid: the digest matches and every builder file hashes as certified.
        reasons: why it is not valid, one sentence each (empty when valid).
        conformant: the certified verdict (meaningful only when ``valid``).
        summary: one line naming the builder, kit, contract and verdict.
    """

    valid: bool
    reasons: tuple[str, ...]
    conformant: bool
    summary: str


def _load(path: Path) -> dict[str, Any]:
    from conformance.report.documents import DocumentError, read_json

    try:
        # Strict JSON of bounded size and nesting (a deeply nested file crashed the parser).
        data = read_json(path, f"report {str(path)!r}")
    except DocumentError as exc:
        raise VerifyInputError(str(exc)) from None
    if not isinstance(data, dict) or "results" not in data:
        raise VerifyInputError(f"{str(path)!r} is not a kvref-conformance JSON report")
    return data


def _certificate_problem(data: Mapping[str, Any]) -> str | None:
    cert = data.get("certificate")
    if not data.get("complete", False):
        return "the report is incomplete (the run had not ended when it was written)"
    if not isinstance(cert, dict):
        return "the report has no certificate (it is not from a --certify run)"
    if cert.get("format") != CERTIFICATE_FORMAT:
        return f"certificate format {cert.get('format')!r} is not {CERTIFICATE_FORMAT!r}"
    digest = cert.get("digest")
    if not isinstance(digest, dict) or not isinstance(digest.get("value"), str):
        return "the certificate has no digest"
    if not isinstance(cert.get("files"), list):
        return "the certificate lists no builder files"
    return None


def _digest_problem(data: Mapping[str, Any], key: bytes | None) -> str | None:
    digest = data["certificate"]["digest"]
    algorithm = digest.get("algorithm")
    if algorithm == "hmac-sha256" and key is None:
        return f"the digest is keyed (hmac-sha256): set {KEY_ENV} to the key it was made with"
    if key is not None and algorithm != "hmac-sha256":
        # Anyone can recompute a plain sha256: with a key, only the key's signature counts.
        return (
            f"the digest is not signed with the key in {KEY_ENV} (algorithm {algorithm!r}): "
            "anyone can compute a plain sha256, so with a key set only an hmac-sha256 "
            "digest made with that key verifies"
        )
    if algorithm not in ("sha256", "hmac-sha256"):
        return f"unknown digest algorithm {algorithm!r}"
    expected = report_digest(data, key if algorithm == "hmac-sha256" else None)
    if not hmac.compare_digest(expected, str(digest["value"])):
        keyed = " or made with another key" if algorithm == "hmac-sha256" else ""
        return (
            "the digest does not match the report: it was edited after it was "
            f"written{keyed} (digest {digest['value']}, the report hashes to {expected})"
        )
    return None


def _file_problems(files: Sequence[Any], root: Path) -> list[str]:
    problems = []
    for entry in files:
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            problems.append(f"the certificate's file entry {entry!r:.80} has no path")
            continue
        path = root / entry["path"]
        if not path.is_file():
            problems.append(f"builder file {entry['path']} is missing (looked in {root})")
            continue
        now = _sha256(path)
        if now != entry.get("sha256"):
            problems.append(
                f"builder file {entry['path']} changed since it was certified "
                f"(sha256 {entry.get('sha256')}, now {now})"
            )
    return problems


def verify(path: Path, *, root: Path | None = None, key: bytes | None = None) -> Verification:
    """Check a certified report: its digest, and that the builder's files hash as certified.

    Args:
        path: the ``--json`` report of a ``--certify`` run.
        root: where the certificate's relative file paths are read from
            (default: the current directory).
        key: the HMAC key of a keyed digest (default: :data:`KEY_ENV`'s value).

    Raises:
        VerifyInputError: the file cannot be read, or is not a JSON report.
    """
    data = _load(path)
    key = _key() if key is None else key
    problem = _certificate_problem(data)
    reasons = [problem] if problem else []
    cert: dict[str, Any] = data.get("certificate") or {}
    if not reasons:
        digest = _digest_problem(data, key)
        reasons += [digest] if digest else []
        reasons += _file_problems(cert["files"], Path.cwd() if root is None else root)
    conformant = bool(cert.get("conformant")) and bool(data.get("ok"))
    summary = (
        f"builder {cert.get('builder', data.get('builder'))}, kit {cert.get('kit_version')}, "
        f"{cert.get('contract')} contract, {cert.get('device')} ({cert.get('device_name')}), "
        f"torch {cert.get('torch')}, profile {cert.get('profile')}, seed {cert.get('seed')}: "
        + ("CONFORMANT" if conformant else "NOT CONFORMANT")
    )
    return Verification(
        valid=not reasons, reasons=tuple(reasons), conformant=conformant, summary=summary
    )


def verify_main(argv: Sequence[str]) -> int:
    """``kvref-conformance verify REPORT``: 0 valid, 1 not (with the reasons), 2 bad input."""
    parser = argparse.ArgumentParser(
        prog="kvref-conformance verify",
        description="Check a --certify report: its digest, and that the builder's source "
        f"files still hash as certified (a keyed digest reads its key from ${KEY_ENV}).",
    )
    parser.add_argument("report", type=Path, help="the certified run's --json report")
    parser.add_argument(
        "--root",
        type=Path,
        help="directory the certificate's relative file paths are read from (default: .)",
    )
    parser.add_argument(
        "--conformant",
        action="store_true",
        help="also exit 1 when the certified verdict is not conformant",
    )
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return 0 if exc.code == 0 else 2
    try:
        found = verify(args.report, root=args.root)
    except VerifyInputError as exc:
        print(f"kvref-conformance verify: error: {exc}", file=sys.stderr)
        return 2
    if not found.valid:
        print(f"{args.report}: NOT VALID", file=sys.stderr)
        for reason in found.reasons:
            print(f"  - {reason}", file=sys.stderr)
        return 1
    print(f"{args.report}: valid: {found.summary}")
    return 1 if args.conformant and not found.conformant else 0
