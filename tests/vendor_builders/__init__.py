"""Vendor-style KV cache config builders written for the reach proof of the kit.

Each builder keeps kvref's reference behaviour for ordinary models (it calls
``super()``) and specialises on the model family it exists for, as platform
builders do:

- :mod:`.deepseek_v4`: DeepSeek-V4-style shared tuples (every decoder
  layer's caches of one block table packed side by side in one per-block
  slot); :mod:`.deepseek_v4_mtp_bug` is the same builder with a planted
  memory-safety bug in the MTP draft layer's slot;
- :mod:`.glm5`: GLM-5-style hybrids whose linear-attention states ride on
  the slots of the sparse-MLA tuples of another group (legal: a block ID
  belongs to one group at a time);
- :mod:`.hydra`: a made-up vendor family ("Hydra") that no built-in family
  produces, reached only through the vendor's own models (``--models``).

:mod:`.slots` is the tuple-slot arithmetic they share.
"""
