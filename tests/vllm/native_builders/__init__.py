"""Platform builders written the way vendors write them: against vLLM 0.33.0, not kvref.

Every builder here subclasses vLLM's own
``vllm.v1.core.kv_cache_planning.DefaultKVCacheConfigBuilder``, takes vLLM's
spec classes (``vllm.v1.kv_cache_interface``) and reads the real ``VllmConfig``
it is handed (``model_config.hf_config``, ``speculative_config``,
``parallel_config``, ``cache_config``, ``scheduler_config``,
``attention_config``).  Ordinary models go to ``super()``; each builder
specialises a few model families behind strict gates (exact ``type(spec) is``
tests, a cache role that must be present and another that must be absent).

The kit loads them through its vLLM adapter
(``conformance.harness.adapters.load_builder("tests.vllm.native_builders.<mod>:<Class>")``).

Legal builders (the kit must pass them, up to vLLM's own upstream defects):

- :mod:`.hydra`: ``HydraPassThroughBuilder``, gates for a family no built-in
  generator draws, ``super()`` everywhere the kit goes;
- :mod:`.deepseek_v32`: ``DeepSeekV32TupleBuilder``, DeepSeek-V3.2 latent and
  indexer side by side on a 4 KiB granule, with a ``_get_pool_bytes_per_block``
  that answers for that family and returns ``None`` ("Core probes") otherwise;
- :mod:`.glm5`: ``GLM5TopDownBuilder``, its own placement for GLM-5 hybrids
  (sparse tables packed down from the top of the block, KDA states up from byte
  0, groups overlaid at one block ID);
- :mod:`.deepseek_v4`: ``DeepSeekV4TupleBuilder``, its own grouping (one table
  per kind and block size) and placement (per-decoder-layer shared tuples).
- :mod:`.drafts`: ``ScattersTargetsBuilder``, every target layer in a group of
  its own, drafters kept together;
- :mod:`.padded`: ``Padded4KiBBuilder``, vLLM's plan on a backing padded to
  4 KiB per block (and the device layers' block-stride alignment);
- :mod:`.alignment`: ``DmaAlignedGroupsBuilder``, plain attention groups whose
  specs ask block strides for 4 KiB multiples of the layers' alignment.

Broken builders (one planted bug each; the docstring names the invariant):

- :mod:`.deepseek_v4_mtp_bug`: MTP tuples over the last decoder layer's
  (``KV-PLACE-NO-LAYER-OVERLAP``);
- :mod:`.glm5_bugs`: a backing one block short (``KV-PLACE-BACKING-SIZE``), a
  placement that reverses its input groups' layer lists in place
  (``KV-PLACE-INPUT-UNCHANGED``), a grouping that drops the MTP layer
  (``KV-GROUP-PARTITION``);
- :mod:`.deepseek_v32_bug`: a pool-bytes answer without the granule
  (``KV-PLACE-POOL-BYTES``);
- :mod:`.alignment`: ``DropsAlignmentBuilder``, group specs rebuilt without
  the backends' block-stride alignment (``KV-GROUP-SPEC-MEANING``);
- :mod:`.pool_bytes_mutates`: ``CompactsGroupsBuilder``, a pool-bytes hook
  that drops the caller's empty groups in place (``KV-PLACE-INPUT-UNCHANGED``);
- :mod:`.inherits`: ``GhostLayerBuilder``, a ghost layer in large pools that
  fails the invariants vLLM's own projection defect fails too
  (tests/vllm/test_inherited_native.py).

Field reports, a broken builder beside a legal one behind the same gate
(tests/vllm/test_field_bugs_native.py):

- :mod:`.field_gates`: an ``isinstance(spec, MLAAttentionSpec)`` gate that
  packs latents side by side and sizes a page as one latent head, met by the
  hidden-state cache (``LatentHeadPageBuilder``; legal:
  ``PacksLatentsBuilder``); uniform-type group specs re-created with
  ``cache_config.block_size`` (``EngineBlockSizeGroupsBuilder``; legal:
  ``RebuildsUniformGroupsBuilder``);
- :mod:`.field_reports`: HiSparse layers bound at their tensor's base offset
  (``HiSparseBaseOffsetBuilder``; legal: ``HiSparseSplitLayersBuilder``), Mamba
  specs beside a drafter without their speculative blocks
  (``MambaDropsSpeculativeBlocksBuilder``; legal:
  ``MambaKeepsSpeculativeBlocksBuilder``), packed full-attention tensors split
  by layer, each stepping blocks by its page size instead of the packed block
  (``PageStrideLayersBuilder``; legal: ``PackedStrideLayersBuilder``);
- :mod:`.config_writes`: hooks that write the ``VllmConfig``, its
  ``cache_config.block_size`` and ``scheduler_config`` fields included.

:mod:`._common` holds the gates and the per-block arithmetic they share.
"""
