"""Shards and merge on a vLLM-native builder: three shards give the whole run.

The kvref-native proofs and the option and input checks: tests/extensions/test_shard.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm.v1.core.kv_cache_planning")

from tests.shard_runs import merge_is_whole, whole_and_shards
from tests.vllm.test_native_builders import BROKEN as NATIVE_BROKEN
from tests.vllm.test_native_builders import assert_caught_in_json

pytestmark = pytest.mark.vllm

BROKEN = "tests.vllm.native_builders.glm5_bugs:GLM5ShortBackingBuilder"
SELECT = "KV-GROUP-PARTITION,KV-PLACE-BACKING-SIZE,KV-PLACE-IN-BOUNDS,KV-CORE-MEMORY"


# Sharding and merging are the kit's own machinery, whatever vLLM runs the
# builder; the kit's per-release rules are proven elsewhere under each release.
@pytest.mark.release_independent
def test_three_shards_give_the_whole_run(tmp_path: Path) -> None:
    """The GLM-5 short backing: the same verdicts, counts, counterexample and reach."""
    whole = merge_is_whole(whole_and_shards(BROKEN, tmp_path, select=SELECT))
    # The whole run is the CLI naming a vLLM-native builder: its planted bug is
    # caught as the builder's own finding, and nothing unmeant fails.
    assert_caught_in_json(next(c for c in NATIVE_BROKEN if c.qualname == BROKEN), whole)
    # The vendor's GLM-5 code ran, in the shard that drew the family.
    assert whole["reach"] is not None and whole["reach"]["executed"] > 0
