"""Run builders written against vLLM 0.33.0's own ``KVCacheConfigBuilder`` through the kit.

:func:`wrap_vllm_builder` turns a vLLM-native builder class (vLLM's
``DefaultKVCacheConfigBuilder`` or a vendor's subclass) into a kvref builder
class: every hook converts its kvref inputs to vLLM objects
(:mod:`kvref.interop.vllm`), calls the native hook and converts the result
back.  The class also brings vLLM's own Core flow as ``kvref_core``, which
the runner uses for the Core scenario instead of kvref's, so the kit judges
what vLLM itself would plan.

vLLM is imported only when a builder is wrapped: importing this module does not need it.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import pickle
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

import attrs

from conformance.errors import BuilderKitError, KitError, kit_side
from conformance.generate.limits import declared_unsupported
from conformance.harness import answer_plainness, native_input_changes
from conformance.harness.guard import groups_key
from kvref.builder import KVCacheConfigBuilder
from kvref.config import PlanningConfig
from kvref.interop import vllm as iv
from kvref.planning import KVCachePlan
from kvref.records import KVCacheConfig, KVCacheGroupSpec
from kvref.specs import KVCacheSpec

__all__ = ["NoBlockPlacementError", "VLLMBuilderAdapter", "wrap_vllm_builder"]


class NoBlockPlacementError(ValueError):
    """A placement asked for fewer than one block gave an answer kvref cannot represent.

    A ``ValueError``, because that is what vLLM's Core takes for "this
    length does not fit" where it probes placements (contract.md#core-flow).
    """


#: The signature of :func:`kvref.planning.plan_kv_cache` that ``kvref_core`` has.
CoreFlow = Callable[
    [Any, PlanningConfig, Sequence[Mapping[str, KVCacheSpec]], "int | Sequence[int]"],
    KVCachePlan,
]


class VLLMBuilderAdapter(KVCacheConfigBuilder):
    """Base of the classes :func:`wrap_vllm_builder` makes; one native instance per instance.

    Attributes:
        native_cls: the wrapped vLLM builder class.
        kvref_core: vLLM's Core flow with ``native_cls`` installed (see
            :func:`wrap_vllm_builder`).
        kvref_unsupported: inputs the kit must not draw (conformance.generate.limits):
            vLLM 0.33.0 keeps groups on the host only as HiSparse's source
            storage, so no example names host-resident layers outside HiSparse;
            the host invariants are judged on HiSparse's host pools.
    """

    native_cls: ClassVar[type[Any]]
    kvref_core: ClassVar[CoreFlow]
    kvref_unsupported: ClassVar[tuple[str, ...]] = ("host_outside_hisparse",)

    def __init__(self) -> None:
        # vLLM makes a fresh builder for every phase; so does the kit, one
        # adapter (and so one native instance) per phase.
        with builders_own():
            self.native = self.native_cls()

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        """Group through the native hook; what it changes in its input is mirrored back.

        vLLM's contract lets the hook rewrite the entries of the dict it gets
        (the default builder promotes specs there with the hybrid manager
        disabled), so replaced, added or removed entries are written back into
        ``kv_cache_spec``.  A spec *object* the hook changes in place is a
        change of the caller's own objects, which the contract forbids: it is
        mirrored onto the kit's kvref spec object, field by field, so the
        kit's purity check sees it exactly as it would on a kvref builder.

        Raises:
            KitError: the kit could not express its own input for vLLM.
            VLLMOutputError: the hook returned something that is not a list of
                vLLM groups kvref can represent.
        """
        with kit_side("vLLM adapter", "converting the grouping input to vLLM"):
            vcfg = iv.to_vllm_config(config)
            given = iv.specs_to_vllm(kv_cache_spec)
        objects = dict(given)
        pristine = {name: copy.copy(spec) for name, spec in given.items()}
        with _as_vllm_sees(config), _config_watched(config, vcfg), _native_scope():
            groups = self.native.get_kv_cache_groups(vcfg, given)
        for name, spec in objects.items():
            if _fields(spec) != _fields(pristine[name]):
                _mirror(kv_cache_spec[name], _converted(iv.layer_spec_from_vllm, spec))
        if list(given) != list(objects) or any(given[n] is not objects.get(n) for n in given):
            _write_back(
                kv_cache_spec,
                {
                    n: kv_cache_spec[n]
                    if s is objects.get(n)
                    else _converted(iv.layer_spec_from_vllm, s)
                    for n, s in given.items()
                },
            )
        converted: list[KVCacheGroupSpec] = _converted(iv.groups_from_vllm, groups, list)
        return converted

    def get_kv_cache_config_from_groups(
        self,
        config: PlanningConfig,
        kv_cache_groups: Sequence[KVCacheGroupSpec],
        num_blocks: int,
    ) -> KVCacheConfig:
        """Place through the native hook; changes to its groups are mirrored back.

        Raises:
            KitError: the kit could not express its own input for vLLM.
            VLLMOutputError: the hook returned something that is not a vLLM
                ``KVCacheConfig`` kvref can represent.
        """
        result = _on_vllm_groups("placement", self.native, config, kv_cache_groups, num_blocks)
        kvi = iv.vllm_modules().kvi
        try:
            placed: KVCacheConfig = _converted(iv.config_from_vllm, result, kvi.KVCacheConfig)
        except iv.VLLMOutputError as exc:
            if num_blocks >= 1:
                raise
            # vLLM's Core asks for no block while it tests whether a length
            # fits (HiSparse's auto-fit), and takes a ValueError as "does not
            # fit"; vLLM's own answer there has negative sizes kvref cannot
            # hold.  The kit's own scenarios never ask for fewer than one.
            raise NoBlockPlacementError(
                f"placement for num_blocks={num_blocks} has no kvref form: {exc}"
            ) from exc
        return placed


def _native_pool_bytes(
    self: VLLMBuilderAdapter,
    config: PlanningConfig,
    kv_cache_groups: Sequence[KVCacheGroupSpec],
) -> int | None:
    """The native ``_get_pool_bytes_per_block`` answer (installed where the native overrides it).

    The answer is passed on as it is: the kit's guard judges its type (an
    ``int`` or ``None``), as it does for a kvref builder.  Changes to its
    groups are mirrored back, as placement's are: vLLM's Core hands the same
    list on to placement, so the kit's purity check must see them.
    """
    value: Any = _on_vllm_groups("pool-bytes", self.native, config, kv_cache_groups)
    return value  # type: ignore[no-any-return]


#: The native hook each kind of call on groups runs.
_GROUP_HOOKS = {
    "placement": "get_kv_cache_config_from_groups",
    "pool-bytes": "_get_pool_bytes_per_block",
}


def _on_vllm_groups(
    what: str,
    native: Any,
    config: PlanningConfig,
    kv_cache_groups: Sequence[KVCacheGroupSpec],
    *args: Any,
) -> Any:
    """The ``what`` hook of the native builder on the groups' vLLM form, with ``*args``.

    ``what`` (a key of :data:`_GROUP_HOOKS`) also names the call in a
    kit-side error.  Changes to the vLLM groups are mirrored back onto
    ``kv_cache_groups``.
    """
    with kit_side("vLLM adapter", f"converting the {what} input to vLLM"):
        vcfg = iv.to_vllm_config(config)
        groups = iv.groups_to_vllm(kv_cache_groups)
    objects = list(groups)
    pristine = [_group_state(g) for g in groups]
    with _as_vllm_sees(config), _config_watched(config, vcfg), _native_scope():
        # Looked up in the native scope too: a hook a property or __getattr__
        # hands out runs the builder's code, traced and owned as the call is.
        result = getattr(native, _GROUP_HOOKS[what])(vcfg, groups, *args)
    _mirror_groups(kv_cache_groups, groups, objects, pristine)
    return result


#: Around each call of the native builder's own code.  A worker that measures
#: reach traces this alone (:func:`set_native_scope`): the adapter's
#: conversions around it are the kit's code, and traced they cost about six
#: times as much.
_NATIVE_SCOPE: list[Callable[[], contextlib.AbstractContextManager[Any]]] = [contextlib.nullcontext]


def set_native_scope(scope: Callable[[], contextlib.AbstractContextManager[Any]]) -> None:
    """Run every native hook call inside ``scope()`` (the worker's reach tracer)."""
    _NATIVE_SCOPE[0] = scope


@contextlib.contextmanager
def _native_scope() -> Iterator[None]:
    # Only the native builder's code runs inside: a KitError from there is its own.
    with _NATIVE_SCOPE[0](), builders_own():
        yield


@contextlib.contextmanager
def builders_own() -> Iterator[None]:
    """Around code where only the builder's (and vLLM's) code runs: its KitError is its own."""
    try:
        yield
    except KitError as exc:
        raise BuilderKitError.of(exc) from None


@contextlib.contextmanager
def _as_vllm_sees(config: PlanningConfig) -> Iterator[None]:
    """Around a native hook: vLLM quiet, and HiSparse reading ``config`` as Core's flow does.

    vLLM derives HiSparse's decode query length and shared-pool choice from
    the engine; the hooks must see the values the example sets, exactly as
    :func:`kvref.interop.vllm.plan_with_vllm` shows them to Core.
    """
    with iv.hisparse_patches(config), iv.quiet_vllm():
        yield


#: The state of a fresh ``VllmConfig`` per ``PlanningConfig`` (each call's is a copy
#: of one template, so one walk serves every call with that config).
_PRISTINE: dict[PlanningConfig, dict[str, Any]] = {}


@contextlib.contextmanager
def _config_watched(config: PlanningConfig, vcfg: Any) -> Iterator[None]:
    """Around a native hook: record each change it makes to the ``VllmConfig`` it was handed.

    The contract lets a hook read the config, never change it (Core's own
    flow changes ``max_model_len`` and the block override between calls, and
    a hook that writes them plans the next call wrong).  The kit never sees
    this object, so the change is recorded for the guard to report
    (:mod:`conformance.harness.native_input_changes`), as a changed spec object is.
    """
    with kit_side("vLLM adapter", "reading the VllmConfig's state"):
        before = _state_before(config, vcfg)
    try:
        yield
    finally:
        with kit_side("vLLM adapter", "reading the VllmConfig's state"):
            # Pickling the whole object again proves it unchanged faster than
            # the walk; the walk names what changed, or finds that what did
            # lies deeper than a hook's planning inputs.
            changes = [] if iv.is_pristine(config, vcfg) else _changes_read(before(), vcfg)
        native_input_changes.record(*changes)


def _state_before(config: PlanningConfig, vcfg: Any) -> Callable[[], dict[str, Any]]:
    """How to read ``vcfg``'s state as handed to a hook, asked only if the hook changed it.

    A copy unpickled from :func:`kvref.interop.vllm.pristine_pickle` is read
    from that pickle afresh, after the call (most hooks change nothing, and
    the walk costs more than the call); any other copy is read now.
    """
    known = _PRISTINE.get(config)
    if known is not None:
        return lambda: known
    source = iv.pristine_pickle(config)
    if source is not None:
        return lambda: _remember(
            config, native_input_changes.object_state(pickle.loads(source), "vllm_config")
        )
    walked = _remember(config, native_input_changes.object_state(vcfg, "vllm_config"))
    return lambda: walked


def _remember(config: PlanningConfig, state: dict[str, Any]) -> dict[str, Any]:
    if len(_PRISTINE) > 64:
        _PRISTINE.clear()
    _PRISTINE[config] = state
    return state


def _changes_read(before: dict[str, Any], vcfg: Any) -> list[str]:
    """The hook's changes to ``vcfg``; an object it left there that cannot be read is one."""
    try:
        return native_input_changes.state_changes(
            before, native_input_changes.object_state(vcfg, "vllm_config")
        )
    except Exception as exc:
        # The same walk read the pristine copy before the call: what fails
        # now, the hook put there.  Its message is the hook's too: not read.
        return [f"vllm_config: the hook left a value that cannot be read ({type(exc).__name__})"]


def _converted(convert: Callable[[Any], Any], value: Any, expected: Any = object) -> Any:
    """``convert(value)``: the builder's answer in kvref records.

    A :class:`~kvref.interop.vllm.VLLMOutputError` is the builder's (its answer
    does not convert), and so is any exception on an answer that is not of
    the documented type or holds a value vLLM's records never hold
    (:func:`~conformance.harness.answer_plainness.odd_part`).  Any other
    exception, on a plain answer of the documented type, is the converter's
    own failure: a kit error, never a verdict.
    """
    try:
        return convert(value)
    except iv.VLLMOutputError:
        raise
    except Exception as exc:
        # The answer's own methods may be what raised: describe it by types only.
        if not isinstance(value, expected):
            raise iv.VLLMOutputError(
                f"cannot convert a {type(value).__name__}: {type(exc).__name__}"
            ) from exc
        odd = answer_plainness.odd_part(value)
        if odd is not None:
            raise iv.VLLMOutputError(
                f"cannot convert the answer: it holds {odd}, where vLLM's records hold "
                f"plain values ({type(exc).__name__} reading it)"
            ) from exc
        with kit_side("vLLM adapter", "converting the builder's answer back to kvref"):
            raise


def _fields(obj: Any) -> tuple[Any, ...]:
    """A vLLM dataclass's field values, compared by value (``obj`` itself otherwise)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return tuple(getattr(obj, f.name, None) for f in dataclasses.fields(obj))
    return (obj,)


def _group_state(group: Any) -> tuple[Any, ...]:
    """What a placement hook could change in a vLLM group: its fields and its spec's."""
    return (*_fields(group), list(getattr(group, "layer_names", ())), _fields(group.kv_cache_spec))


def _mirror(target: Any, source: Any) -> None:
    """Give the kvref record ``target`` the field values of ``source``, in place."""
    for field in attrs.fields(type(target)):
        object.__setattr__(target, field.name, getattr(source, field.name))
    forget = getattr(target, "_forget_memoised", None)
    if callable(forget):
        forget()


def _mirror_groups(
    kvref_groups: Sequence[KVCacheGroupSpec],
    groups: list[Any],
    objects: list[Any],
    pristine: list[tuple[Any, ...]],
) -> None:
    """Mirror a placement hook's changes to its vLLM groups onto the kit's kvref groups."""
    for kvref_group, group, before in zip(kvref_groups, objects, pristine, strict=True):
        if _group_state(group) != before:
            _mirror(kvref_group, _converted(iv.group_from_vllm, group))
    if isinstance(kvref_groups, list) and (
        len(groups) != len(objects)
        or any(a is not b for a, b in zip(groups, objects, strict=False))
    ):
        by_id = {id(o): k for o, k in zip(objects, kvref_groups, strict=True)}
        kvref_groups[:] = [by_id.get(id(g)) or _converted(iv.group_from_vllm, g) for g in groups]


def _write_back(target: Mapping[str, KVCacheSpec], changed: Mapping[str, KVCacheSpec]) -> None:
    if not isinstance(target, dict):  # a read-only mapping: nothing the builder could change
        return
    target.clear()
    target.update(changed)


def vllm_core_flow(
    builder: Any,
    config: PlanningConfig,
    kv_cache_specs: Sequence[Mapping[str, KVCacheSpec]],
    available_memory: int | Sequence[int],
    native_cls: type[Any] | None = None,
) -> KVCachePlan:
    """The Core flow of vLLM 0.33.0, with its builder calls routed through ``builder``.

    ``builder`` is what the kit hands a Core flow (:func:`kvref.planning.plan_kv_cache`
    takes the same): a kvref builder class, in the kit the factory whose
    instances judge every hook answer before passing it on
    (``conformance.scenarios.core``).  vLLM's Core asks its platform for
    builders and calls them with vLLM objects; each one it gets here is a
    :class:`_ThroughKvref` that converts its arguments to kvref records,
    calls the builder a fresh ``builder()`` stands for (an isolated one: in
    its worker) and converts the answer back.  So vLLM plans with the
    builder's answers, and the Core invariants judge vLLM's plan; the hook
    answers inside vLLM's flow are not judged one by one (see the class).

    With ``builder`` ``None`` (or the adapter of ``native_cls`` itself) vLLM's
    Core calls ``native_cls`` directly: exactly what vLLM would plan.

    Raises:
        What :func:`kvref.interop.vllm.plan_with_vllm` raises.
    """
    if builder is None or (
        native_cls is not None and getattr(builder, "native_cls", None) is native_cls
    ):
        if native_cls is None:
            raise TypeError("vllm_core_flow needs a builder or the native class")
        with builders_own():
            # vLLM's Core calls the builder itself: no code of the kit runs inside.
            return iv.plan_with_vllm(native_cls, config, kv_cache_specs, available_memory)
    return iv.plan_with_vllm(_through(builder, config), config, kv_cache_specs, available_memory)


def _through(builder: Any, config: PlanningConfig) -> type[Any]:
    """A vLLM-native builder class whose instances run a fresh ``builder()`` on kvref records."""
    base = iv.vllm_modules().builder_module.KVCacheConfigBuilder

    def planning_config(vcfg: Any) -> PlanningConfig:
        # Core lowers max_model_len while it auto-fits and may set the
        # override: the hooks must see the config as Core holds it now.
        return attrs.evolve(
            config,
            max_model_len=int(vcfg.model_config.max_model_len),
            num_gpu_blocks_override=vcfg.cache_config.num_gpu_blocks_override,
        )

    class _ThroughKvref(base):  # type: ignore[misc, valid-type]
        # Not kvref's public KvrefKVCacheConfigBuilder, though both hand vLLM
        # a kvref builder's answers: that one plans what it reads from the
        # VllmConfig with a class it instantiates per call, turns conversion
        # failures into the builder's UnsupportedError, retypes kvref's errors
        # as vLLM's, logs vLLM's warnings and never writes the specs back.
        # Here the example's own PlanningConfig is planned (only Core's
        # changes between calls read back), with one builder instance (an
        # isolated worker's proxy), conversion failures are kit errors, the
        # builder's errors and spec rewrites reach vLLM as they are, and each
        # placement is judged in the flow: each of those decides a verdict.
        def __init__(self) -> None:
            made = builder()
            # The kit's checking proxy judges each answer as kvref's Core would
            # ask it; vLLM's Core asks otherwise (it probes under
            # num_gpu_blocks_override and hands a worker the projected groups
            # of its PP defect), so most of those verdicts would blame the
            # builder for vLLM's flow.  Its answers go straight to vLLM, after
            # the proxy judged each placement's memory safety (which holds
            # however vLLM asks); the Core invariants judge the plan vLLM makes.
            self.inner = getattr(made, "inner", made)
            self.judge: Any = getattr(made, "judge_in_vllm_flow", None)
            self.declared: dict[tuple[tuple[str, ...], ...], int | None] = {}

        def get_kv_cache_groups(self, vcfg: Any, kv_cache_spec: dict[str, Any]) -> list[Any]:
            with kit_side("vLLM adapter", "converting Core's grouping input to kvref"):
                specs = {n: iv.layer_spec_from_vllm(s) for n, s in kv_cache_spec.items()}
            groups = self.inner.get_kv_cache_groups(planning_config(vcfg), specs)
            with kit_side("vLLM adapter", "converting a checked grouping back to vLLM"):
                # The checked answer replaces the entries grouping rewrote, as vLLM's own would.
                kv_cache_spec.clear()
                kv_cache_spec.update(iv.specs_to_vllm(specs))
                return iv.groups_to_vllm(groups)

        def get_kv_cache_config_from_groups(
            self, vcfg: Any, kv_cache_groups: list[Any], num_blocks: int
        ) -> Any:
            with kit_side("vLLM adapter", "converting Core's placement input to kvref"):
                groups = iv.groups_from_vllm(list(kv_cache_groups))
            placed = self.inner.get_kv_cache_config_from_groups(
                planning_config(vcfg), groups, num_blocks
            )
            if self.judge is not None:
                self._judge(vcfg, list(kv_cache_groups), num_blocks, placed)
            with kit_side("vLLM adapter", "converting a checked placement back to vLLM"):
                return iv.config_to_vllm(placed)

        def _judge(self, vcfg: Any, vgroups: list[Any], num_blocks: int, placed: Any) -> None:
            with kit_side("vLLM adapter", "converting Core's placement input to kvref"):
                # Converted afresh: the hook's changes to the list it was handed
                # are mirrored back into that list, and placement is judged on
                # the groups vLLM asked about.
                groups = iv.groups_from_vllm(vgroups)
                key = groups_key(groups)
            if key not in self.declared:
                # vLLM asked no pool bytes of these groups (HiSparse, a re-plan):
                # the builder's answer decides whether several allocations are legal.
                self._get_pool_bytes_per_block(vcfg, vgroups)
            with kit_side("vLLM adapter", "judging a placement inside vLLM's Core flow"):
                self.judge(
                    planning_config(vcfg), groups, num_blocks, placed, self.declared.get(key)
                )

        def _get_pool_bytes_per_block(self, vcfg: Any, kv_cache_groups: list[Any]) -> int | None:
            with kit_side("vLLM adapter", "converting Core's pool-bytes input to kvref"):
                groups = iv.groups_from_vllm(list(kv_cache_groups))
                # Keyed as asked: a hook that rewrites its groups changes them in place.
                key = groups_key(groups)
            answer: int | None = self.inner._get_pool_bytes_per_block(planning_config(vcfg), groups)
            self.declared[key] = answer
            return answer

    return _ThroughKvref


def resolve_vllm_class(qualname: str) -> type[Any]:
    """The class vLLM's ``resolve_obj_by_qualname`` gives for ``qualname`` (``module:Class`` too).

    vLLM's platform hook names its builder as ``package.module.Class``;
    the kit's ``module:Class`` is the same name.

    Raises:
        Exception: what vLLM's resolution raises (an import error, a missing name).
    """
    from vllm.utils.import_utils import resolve_obj_by_qualname

    resolved: type[Any] = resolve_obj_by_qualname(qualname.replace(":", "."))
    return resolved


def resolution_facts(made: object, named: type, base: type) -> tuple[int, str, bool, bool]:
    """What the kit records of the object a resolution ``made`` of the ``named`` class.

    ``(id, type name, is an instance of ``named``, is an instance of
    ``base``)``; ``base`` is the builder class of the form resolved (kvref's
    or vLLM's).
    """
    kind = type(made)
    return (
        id(made),
        f"{kind.__module__}.{kind.__qualname__}",
        isinstance(made, named),
        isinstance(made, base),
    )


def resolve_as_vllm(qualname: str) -> tuple[KVCacheConfigBuilder, tuple[int, str, bool, bool]]:
    """Resolve ``qualname`` as vLLM's ``get_kv_cache_config_builder`` does, fresh each call.

    Returns the adapter over the object resolution made, and what the kit
    records of it: ``(id, type name, is an instance of the named class, is a
    vLLM builder)``.  The adapter's hooks run on that very object.

    Raises:
        Exception: what resolution or the construction raised.
    """
    named = resolve_vllm_class(qualname)
    made = named()
    base = iv.vllm_modules().builder_module.KVCacheConfigBuilder
    kind = type(made)
    facts = resolution_facts(made, named, base)
    adapter_cls = wrap_vllm_builder(kind if isinstance(made, base) else named)
    adapter: Any = adapter_cls.__new__(adapter_cls)
    adapter.native = made
    built: KVCacheConfigBuilder = adapter
    return built, facts


def _warm_up() -> None:
    """Build one ``VllmConfig`` and convert one spec, so later conversions import nothing."""
    from kvref.specs import FullAttentionSpec

    with kit_side("vLLM adapter", "preparing vLLM's config and spec types"):
        iv.to_vllm_config(PlanningConfig())
        iv.specs_to_vllm(
            {
                "warm": FullAttentionSpec(
                    block_size=16, num_kv_heads=1, head_size=64, dtype="float16"
                )
            }
        )


def _unsupported(native_cls: type[Any]) -> tuple[str, ...]:
    own = declared_unsupported(native_cls)
    return tuple(dict.fromkeys((*VLLMBuilderAdapter.kvref_unsupported, *own)))


def wrap_vllm_builder(native_cls: type[Any]) -> type[KVCacheConfigBuilder]:
    """A kvref builder class that runs the vLLM-native builder class ``native_cls``.

    Each instance owns a fresh ``native_cls()``; its hooks convert inputs to
    vLLM objects (a real ``VllmConfig`` matching the ``PlanningConfig``), call
    the native hooks and convert the results back.  A result that does not
    convert raises :class:`~kvref.interop.vllm.VLLMOutputError` from the
    hook, so the kit reports it.

    The class carries ``kvref_core``, with the signature of
    :func:`kvref.planning.plan_kv_cache`: it ignores the builder it is given
    and runs vLLM's own Core flow with ``native_cls`` installed as the
    platform's builder (:func:`kvref.interop.vllm.plan_with_vllm`).

    Raises:
        VLLMUnavailableError: vLLM cannot be imported (the message says how to
            install it).
        TypeError: ``native_cls`` is not a class.
    """
    if not isinstance(native_cls, type):
        raise TypeError(f"wrap_vllm_builder needs a builder class, got {native_cls!r}")
    # Import vLLM now, outside any per-call deadline: the first import takes
    # seconds, and the first VllmConfig imports more of vLLM lazily (about
    # 10 s under the reach tracer of an isolated worker, past the default
    # deadline): a call's time must be the builder's, not the kit's.
    iv.vllm_modules()
    _warm_up()

    def core(
        builder: Any,
        config: PlanningConfig,
        kv_cache_specs: Sequence[Mapping[str, KVCacheSpec]],
        available_memory: int | Sequence[int],
    ) -> KVCachePlan:
        return vllm_core_flow(builder, config, kv_cache_specs, available_memory, native_cls)

    name = f"VLLM{native_cls.__name__}"
    namespace: dict[str, Any] = {
        "__doc__": f"kvref adapter of vLLM's {native_cls.__module__}.{native_cls.__qualname__}.",
        "__module__": __name__,
        "native_cls": native_cls,
        "kvref_core": staticmethod(core),
        # What the vendor's class declares it lacks, beside what vLLM itself lacks.
        "kvref_unsupported": _unsupported(native_cls),
    }
    # The kit checks _get_pool_bytes_per_block only on builders that override
    # it; forward it only where the native class does, or vLLM's default
    # "None: Core probes" would read as an override returning None.
    base = iv.vllm_modules().builder_module.KVCacheConfigBuilder
    native_pool = getattr(native_cls, "_get_pool_bytes_per_block", None)
    if native_pool is not None and native_pool is not base._get_pool_bytes_per_block:
        namespace["_get_pool_bytes_per_block"] = _native_pool_bytes
    adapter: type[KVCacheConfigBuilder] = type(name, (VLLMBuilderAdapter,), namespace)
    adapter.__qualname__ = name
    return adapter
