"""The twin's engine models and their registry (``prefixtune.twin.models``): one model per engine the
adapters know, found by name, and every schedule policy an adapter offers maps onto a queue order the
twin's scheduler implements."""

from __future__ import annotations

import pytest

from prefixtune.engines import get_adapter
from prefixtune.engines.base import SCHEDULE_POLICY, EngineName
from prefixtune.twin.models import known, twin_model
from prefixtune.twin.models.base import TWIN_POLICIES


def test_every_engine_has_one_twin_model_found_by_name() -> None:
    assert known() == tuple(EngineName)
    for engine in EngineName:
        model = twin_model(engine)
        assert model.name == engine and twin_model(f" {engine.value.upper()} ") is model
    with pytest.raises(ValueError, match="unknown engine 'tgi'; known engines: vllm, sglang, trtllm"):
        twin_model("tgi")


@pytest.mark.parametrize("engine", list(EngineName))
def test_every_adapter_policy_maps_onto_a_twin_queue_order(engine: EngineName) -> None:
    model = twin_model(engine)
    for choice in get_adapter(engine).knobs()[SCHEDULE_POLICY].choices:
        policy = model.normalize_policy(str(choice))
        assert policy == str(choice), (engine, choice)  # the adapter's spelling is the engine's
        assert model.twin_policy(policy) in TWIN_POLICIES, (engine, choice)
