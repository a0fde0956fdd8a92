"""PromQL rendering per engine, label selectors, and PrometheusSource on canned API answers."""

from __future__ import annotations

from typing import Any

import pytest

from prefixtune.engines.base import EngineName
from prefixtune.metrics.exposition import Matcher
from prefixtune.metrics.prometheus_source import PrometheusSource, bucket_vector, scalar
from prefixtune.metrics.promql import Selector, gpu_util, window_queries
from prefixtune.metrics.recipe import for_engine

SEL = Selector.pods(["a-0", "a-1"], namespace="ns")


def test_selector_parse_render_round_trip_and_errors() -> None:
    sel = Selector.parse('{namespace="x", pod=~"a|b", app!="y", tier!~"t.*"}')
    assert [(m.label, m.op, m.value) for m in sel.matchers] == [
        ("namespace", "=", "x"),
        ("pod", "=~", "a|b"),
        ("app", "!=", "y"),
        ("tier", "!~", "t.*"),
    ]
    assert Selector.parse(sel.render()) == sel
    assert Selector.parse('namespace="q\\"uote"').matchers[0].value == 'q"uote'
    assert Selector.parse(SEL.render()) == SEL
    with pytest.raises(ValueError, match=r"label=\"value\""):
        Selector.parse("{namespace=x}")
    with pytest.raises(ValueError, match="closing"):
        Selector.parse('{namespace="x"')
    with pytest.raises(ValueError, match="at least one pod"):
        Selector.pods([])


def test_pod_selector_matches_exactly_the_named_pods() -> None:
    pod = next(m for m in SEL.matchers if m.label == "pod")
    assert pod.accepts("a-0") and pod.accepts("a-1")
    assert not pod.accepts("a-01") and not pod.accepts("xa-0")


@pytest.mark.parametrize(
    ("engine", "hit", "den"),
    [
        (EngineName.VLLM, "vllm:prefix_cache_hits_total{", "vllm:prefix_cache_queries_total{"),
        (EngineName.SGLANG, 'mode=~".*_hit"', "sglang:prefill_effective_tokens_total{"),
        (EngineName.TRTLLM, "trtllm_kv_cache_reused_blocks_total{", "trtllm_kv_cache_missed_blocks_total{"),
    ],
)
def test_window_queries_per_engine(engine: EngineName, hit: str, den: str) -> None:
    q = window_queries(for_engine(engine), SEL, 60)
    assert hit in q["hit_rate"] and den in q["hit_rate"]
    assert "[60s]" in q["hit_rate"] and 'namespace="ns"' in q["hit_rate"]
    assert q["ttft_p99_s"].startswith("histogram_quantile(0.99, sum by (le)(increase(")
    assert "_bucket{" in q["itl_p50_s"]
    assert q["running_mean"].startswith("avg(avg_over_time(")
    if engine is EngineName.TRTLLM:
        assert "preemptions_per_s" not in q  # the engine has no preemption counter
        assert "trtllm_prompt_cached_tokens_total" in q["prefill_reduction"]
    else:
        assert "preemptions_per_s" in q
    with pytest.raises(ValueError, match="window_s"):
        window_queries(for_engine(engine), SEL, 0)


def test_gpu_query_tries_both_dcgm_series_and_the_exported_label_variant() -> None:
    q = gpu_util(SEL, 30)
    assert q.count(" or ") == 3
    assert 'DCGM_FI_PROF_GR_ENGINE_ACTIVE{namespace="ns"' in q
    assert 'DCGM_FI_PROF_GR_ENGINE_ACTIVE{exported_namespace="ns", exported_pod=~' in q
    assert "DCGM_FI_DEV_GPU_UTIL{" in q and "* 0.01" in q


def test_scalar_and_bucket_vector_treat_nan_and_empty_as_missing() -> None:
    assert scalar([]) is None
    assert scalar([{"metric": {}, "value": [1, "NaN"]}]) is None
    assert scalar([{"metric": {}, "value": [1, "+Inf"]}]) is None
    assert scalar([{"metric": {}, "value": [1, "0"]}]) == 0.0
    assert scalar([{"value": [1, "1"]}, {"value": [1, "2"]}]) is None  # not one aggregated value
    b = bucket_vector(
        [{"metric": {"le": "0.1"}, "value": [1, "3"]}, {"metric": {"le": "+Inf"}, "value": [1, "NaN"]}]
    )
    assert len(b) == 1 and b[0].le == 0.1


class FakeClient:
    """Answers raw range queries with fixed samples and everything else from a table."""

    def __init__(self, raw: dict[str, list[dict[str, Any]]], instant: dict[str, str]) -> None:
        self.raw = raw
        self.instant = instant
        self.asked: list[str] = []

    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        self.asked.append(query)
        assert params is not None and "time" in params
        name = query.split("{", 1)[0]
        if query.endswith("[60s]") and name in self.raw:
            return self.raw[name]
        for prefix, value in self.instant.items():
            if query.startswith(prefix):
                return [{"metric": {}, "value": [0, value]}]
        return []


def series(name: str, points: list[tuple[float, float]], **labels: str) -> dict[str, Any]:
    return {
        "metric": {"__name__": name, "instance": "i0", **labels},
        "values": [[t, str(v)] for t, v in points],
    }


def test_prometheus_source_on_raw_samples_with_a_reset() -> None:
    raw = {
        "vllm:prefix_cache_hits_total": [series("h", [(0, 100), (30, 160), (60, 220)])],
        # reset at t=30: 400 -> 50 counts 50 since the restart
        "vllm:prefix_cache_queries_total": [series("q", [(0, 1000), (30, 400), (60, 450)], pod="a-0")],
        "vllm:request_success_total": [
            series("r", [(0, 10), (60, 70)], finished_reason="length"),
            series("r", [(0, 0), (60, 0)], finished_reason="abort"),
        ],
        "vllm:time_to_first_token_seconds_bucket": [
            series("b", [(0, 0), (60, 30)], le="0.1"),
            series("b", [(0, 0), (60, 60)], le="+Inf"),
        ],
    }
    instant = {
        "avg(avg_over_time(vllm:num_requests_running": "12",
        "max(max_over_time(vllm:num_requests_running": "20",
    }
    client = FakeClient(raw, instant)
    w = PrometheusSource(client, "vllm").measure(SEL, 60, end=1000.0)
    s = w.signals
    assert s.window_s == 60 and (w.start, w.end) == (0, 60)
    assert s.hit_rate == pytest.approx(
        120
        / (  # hits 120; queries: -600 is a reset -> 400 + 50
            400 + 50
        )
    )
    assert s.requests == 60 and s.requests_per_s == pytest.approx(1.0)
    assert s.ttft_p50_s == pytest.approx(0.1)  # rank 30 of 60 at the top of (0, 0.1]
    assert s.running_mean == 12 and s.running_max == 20
    assert s.kv_usage_mean is None and "kv_usage_mean" in s.missing()  # no answer: missing, not 0
    assert s.gpu_util is None
    assert w.resets == ("pod=a-0",)
    assert any("reset" in n for n in w.notes)
    assert "hit_rate" in w.queries


def test_prometheus_source_with_no_data_reports_everything_missing() -> None:
    w = PrometheusSource(FakeClient({}, {}), "sglang").measure('{namespace="ns"}', 60, end=1000.0)
    assert set(w.signals.missing()) == {f for f in w.signals.to_dict() if f != "window_s"}
    assert any("fewer than two samples" in n for n in w.notes)
    with pytest.raises(ValueError, match="window_s"):
        PrometheusSource(FakeClient({}, {}), "sglang").measure(SEL, 0)


def test_matcher_escapes_quotes_and_backslashes_in_promql() -> None:
    m = Matcher("pod", "=", 'a"b\\c')
    assert m.promql() == 'pod="a\\"b\\\\c"'
    assert Selector.parse("{" + m.promql() + "}").matchers == (m,)


def test_a_pod_scraped_by_several_jobs_is_counted_once() -> None:
    """Issue #17: a ServiceMonitor job and an annotation-based job both scrape the pod; every series
    comes twice (job differs, instance may too). Counted once: the same signals as with one job."""

    def rows(job: str, instance: str) -> dict[str, list[dict[str, Any]]]:
        labels = {"job": job, "instance": instance, "namespace": "team-a", "pod": "llama-0"}
        return {
            "vllm:prefix_cache_hits_total": [series("h", [(0, 100), (60, 220)], **labels)],
            "vllm:prefix_cache_queries_total": [series("q", [(0, 1000), (60, 1300)], **labels)],
            "vllm:request_success_total": [
                series("r", [(0, 10), (60, 70)], finished_reason="stop", **labels)
            ],
            "vllm:generation_tokens_total": [series("g", [(0, 0), (60, 6000)], **labels)],
        }

    one = PrometheusSource(FakeClient(rows("pods", "10.0.0.1:8000"), {}), "vllm").measure(SEL, 60, end=1e3)
    twice = rows("pods", "10.0.0.1:8000")
    for name, extra in rows("serviceMonitor/team-a/llama", "10.0.0.1:8000").items():
        twice[name] = twice[name] + extra
    for name, extra in rows("kubernetes-pods", "llama.team-a.svc:8000").items():
        twice[name] = twice[name] + extra
    dup = PrometheusSource(FakeClient(twice, {}), "vllm").measure(SEL, 60, end=1e3)
    assert one.signals.requests == 60
    assert dup.signals.requests == one.signals.requests
    assert dup.signals.requests_per_s == pytest.approx(one.signals.requests_per_s or 0.0)
    assert dup.signals.output_tokens_per_s == pytest.approx(one.signals.output_tokens_per_s or 0.0)
    assert dup.signals.hit_rate == pytest.approx(one.signals.hit_rate or 0.0)


def test_the_operator_selects_by_namespace_and_pod() -> None:
    """A same-named pod in another namespace must not inject series: the selector names both."""
    sel = Selector.pods(["llama-abc-1"], namespace="team-a")
    text = sel.render()
    assert 'namespace="team-a"' in text and "llama" in text
    client = FakeClient({}, {})
    PrometheusSource(client, "vllm").measure(sel, 60, end=1000.0)
    assert client.asked and all('namespace="team-a"' in q for q in client.asked if "{" in q)
