"""The last valid spec kept in the status: what an invalid edit mid-trial is answered with."""

from __future__ import annotations

from prefixtune.controller import status as S
from prefixtune.engines.base import KnobConfig
from prefixtune.tuning.policy import initial_state
from prefixtune.tuning.settings import TuningSettings

STATE = initial_state("vllm", TuningSettings(), KnobConfig(0.9, 16, True, "fcfs"))
SPEC = {"engine": "vllm", "model": "m", "replicas": 2, "image": "vllm/vllm-openai:v0.11.0"}


def test_the_spec_rolled_out_is_kept_and_survives_a_status_built_without_one() -> None:
    status = S.build_status(STATE, [], None, now=1.0, generation=1, ready=(True, "R", ""), valid_spec=SPEC)
    assert S.last_valid_spec(status) == SPEC
    # Text, not an object: a merge patch would merge a spec without ``image`` into the one before.
    assert isinstance(status["policy"][S.POLICY_SPEC_KEY], str)
    later = S.build_status(STATE, [], status, now=2.0, generation=2, ready=(False, "InvalidSpec", "x"))
    assert S.last_valid_spec(later) == SPEC
    newer = {k: v for k, v in SPEC.items() if k != "image"}
    ok = (True, "R", "")
    replaced = S.build_status(STATE, [], later, now=3.0, generation=3, ready=ok, valid_spec=newer)
    assert S.last_valid_spec(replaced) == newer
    S.validate_status(replaced)


def test_no_spec_or_a_garbled_one_reads_as_none() -> None:
    assert S.last_valid_spec(None) is None
    assert S.last_valid_spec({"policy": {S.POLICY_SPEC_KEY: "{not json"}}) is None
    assert S.last_valid_spec({"policy": {S.POLICY_SPEC_KEY: "[1, 2]"}}) is None
