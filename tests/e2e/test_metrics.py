"""/metrics of two `headrace serve` processes on one store, read by Prometheus's own tools: each
store-wide figure counts once however many processes are scraped, the docs' rules and KEDA
queries (docs/monitoring/, quoted by docs/deploy.md) read the store's values and fire each alert
once, the age histogram is one PromQL reads, and a ready task's age counts from when it last
became ready.

The store is filled from this process on a ManualClock set in the past, so tasks have been
ready, dead or running for known times by the host's clock the servers read; the servers run
no workers (`--workers 0`), so nothing changes but what a test does."""

from __future__ import annotations

import asyncio
import re
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

import headrace as hr
from headrace.policy import ErrorClass, ManualClock
from headrace.store.protocol.types import AttemptError, Dead, NewTask, TaskState

from . import prometheus, server
from .commands import ROOT, headrace
from .server import Server

RULES = ROOT / "docs" / "monitoring" / "rules.yml"
SCALED_OBJECT = ROOT / "docs" / "monitoring" / "scaledobject.yaml"
DEPLOY = ROOT / "docs" / "deploy.md"
GATE = "provider:video"
READY_SPAN = 76.0  # the renders became ready evenly over this many seconds: p95 about 72 s
RENDERS = 30
ARCHIVED = 400.0  # seconds the archive task has been ready: past the backlog alert's 300
DEAD_FOR = 1500.0  # seconds the publish tasks have been dead before the redrive test
FAILED = AttemptError.of(ErrorClass.FATAL, "bad_input", "")
DEAD_LETTERS = "tasks died: headrace dlq list"
P95 = 'headrace:stage_age_seconds:p95{stage="render"}'  # the docs' rule


# -- the store's contents


def app_on(db: Path, clock: ManualClock) -> hr.App:
    app = hr.App(f"sqlite:///{db}", clock=clock)
    app.gate(GATE, concurrency=1)  # declared here, by a worker's app: not by serve's
    return app


async def first_clip(db: Path, clock: ManualClock) -> None:
    """A clip holds the video gate's one ticket (the gate's row exists, nothing refused)."""
    async with app_on(db, clock) as app:
        await app.store.submit([NewTask(kind="clip", ref="c1", gates=(GATE,))])
        await app.store.claim("w1", 1, lease_for=86_400.0)


async def the_rest(db: Path, clock: ManualClock, now: float) -> dict[TaskState, int]:
    """Three publish tasks die, an archive task waits `ARCHIVED` s, renders became ready evenly
    over the last `READY_SPAN` s, and a second clip is refused by the gate's cap; the store's
    counts after."""
    async with app_on(db, clock) as app:
        store = app.store
        await store.submit([NewTask(kind="publish", ref=f"p{n}") for n in range(3)])
        for lease in (await store.claim("w1", 3, lease_for=60.0, kinds=["publish"])).leases:
            await store.finish(lease, Dead(FAILED))
        clock.advance(now - ARCHIVED - clock.now())
        await store.submit([NewTask(kind="archive", ref="a1")])
        clock.advance(ARCHIVED - READY_SPAN)
        for n in range(RENDERS):
            await store.submit([NewTask(kind="render", ref=f"r{n}")])
            clock.advance(READY_SPAN / (RENDERS - 1))
        await store.submit([NewTask(kind="clip", ref="c2", gates=(GATE,))])
        refused = await store.claim("w1", 1, lease_for=60.0, kinds=["clip"])
        assert refused.leases == ()
        return await store.counts()


# -- two API processes on one store


@dataclass
class Deployment:
    servers: list[Server]
    before: list[prometheus.Scrape]  # a round of scrapes before the deaths and the backlog
    after: list[prometheus.Scrape]  # and after
    truth: dict[TaskState, int]  # the store's counts, read when the second round was taken
    p95: float  # the renders' p95 age by /v1/stages, read right after that round

    def carrier(self) -> Server:
        """A server whose scrapes carry the store's series (the exporter)."""
        for each in self.servers:
            if "headrace_stage_tasks" in prometheus.scrape(each.url, each.auth("admin")).text:
                return each
        raise AssertionError("no process exports the store's series")


def exports(scrape: prometheus.Scrape) -> bool:
    return "headrace_metrics_exporter 1.0" in scrape.text.splitlines()


def start_two(directory: Path, lease: str) -> list[Server]:
    """Two `headrace serve --workers 0` processes on one SQLite store and media directory."""
    tokens = server.make_tokens(f"sqlite:///{directory / 'serve.db'}")
    env = {"HEADRACE_METRICS_LEASE": lease}
    servers = [server.start(directory, "--workers", "0", tokens=tokens, env=env)]
    try:
        servers.append(server.start(directory, "--workers", "0", tokens=tokens, env=env))
    except BaseException:
        server.stop(servers[0])
        raise
    return servers


def stages_p95(api: Server, kind: str) -> float:
    stages = httpx.get(f"{api.url}/v1/stages", headers=api.auth("moderator")).json()
    [found] = [stage for stage in stages["stages"] if stage["kind"] == kind]
    return float(found["p95_age"])


def near(p95: float) -> float:
    """How far PromQL's p95 may be from /v1/stages': a bucket holds ages it takes as spread
    evenly, and a second may pass between the two reads."""
    return 2.0 + 0.05 * p95


def scrape_all(servers: list[Server]) -> list[prometheus.Scrape]:
    return [prometheus.scrape(s.url, s.auth("admin")) for s in servers]


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    prometheus.tool("promtool")
    directory = tmp_path_factory.mktemp("deployment")
    servers = start_two(directory, "30s")
    try:
        db, now = directory / "serve.db", time.time()
        clock = ManualClock(now - DEAD_FOR)
        asyncio.run(first_clip(db, clock))
        before = scrape_all(servers)
        truth = asyncio.run(the_rest(db, clock, now))
        after = scrape_all(servers)
        yield Deployment(servers, before, after, truth, stages_p95(servers[0], "render"))
    finally:
        for each in servers:
            server.stop(each)


# -- the tests


def test_each_process_s_scrape_is_clean_for_promtool_and_one_carries_the_store(
    deployment: Deployment,
) -> None:
    for scrape in [*deployment.before, *deployment.after]:
        checked = prometheus.check_metrics(scrape.text)
        assert (checked.returncode, checked.stdout, checked.stderr) == (0, "", ""), scrape.text
    carrying = [scrape for scrape in deployment.after if "headrace_stage_tasks" in scrape.text]
    for scrape in carrying:  # the age histogram has its count and sum, every stage its series
        samples = scrape.samples()
        for stage in ("archive", "render", "moderation.validate.image"):  # the last is empty
            labels = {"stage": stage, "instance": scrape.instance, "job": prometheus.JOB}
            labels["class"] = "image" if stage.startswith("moderation") else ""
            count = samples[prometheus.selector("headrace_stage_age_seconds_count", labels)]
            assert samples[prometheus.selector("headrace_stage_age_seconds_sum", labels)] >= 0
            ready = samples[
                prometheus.selector("headrace_stage_tasks", {**labels, "state": "ready"})
            ]
            assert count == ready == {"archive": 1, "render": RENDERS}.get(stage, 0)
    assert len(carrying) == 1, [scrape.instance for scrape in carrying]
    [other] = [scrape for scrape in deployment.after if scrape is not carrying[0]]
    assert exports(carrying[0]) and "headrace_metrics_exporter 0.0" in other.text.splitlines()
    assert "process_resident_memory_bytes" in other.text  # its own series


def keda_queries() -> list[str]:
    return re.findall(r"^\s*query: (.+)$", SCALED_OBJECT.read_text(), re.MULTILINE)


def test_the_docs_quote_the_files_the_tests_run() -> None:
    deploy = DEPLOY.read_text()
    for quoted in (RULES, SCALED_OBJECT):
        assert f"```yaml\n{quoted.read_text()}```" in deploy, quoted
    assert keda_queries() == [
        'sum(headrace_stage_tasks{state="ready"})',
        "max(headrace_stage_oldest_age_seconds)",
    ]


def test_the_docs_rules_fire_once_and_read_the_store_with_two_api_processes(
    deployment: Deployment, tmp_path: Path
) -> None:
    """promtool over ten minutes of the first round of scrapes, then ten of the second, of both
    processes, labelled as Prometheus labels its targets."""
    oldest = max(
        value
        for scrape in deployment.after
        for name, value in scrape.samples().items()
        if name.startswith("headrace_stage_oldest_age_seconds{")
    )
    assert ARCHIVED <= oldest < ARCHIVED + 30  # the archive task's, read by the host's clock
    ready, dead = deployment.truth[TaskState.READY], deployment.truth[TaskState.DEAD]
    assert (ready, dead) == (RENDERS + 2, 3)  # the renders, the archive task, the refused clip
    keda_depth, keda_age = keda_queries()
    at = "16m"  # the deaths and the backlog show from 10m; the backlog alert waits 5m
    case = {
        "input_series": prometheus.input_series([deployment.before, deployment.after], 10),
        "alert_rule_test": [
            alert("HeadraceDeadLetters", at, {"severity": "ticket"}, DEAD_LETTERS),
            alert(
                "HeadraceBacklogAging",
                at,
                {"severity": "page", "stage": "archive"},
                "archive: the oldest ready task has waited over 5 minutes",
            ),
            {"alertname": "HeadraceMetricsExporter", "eval_time": at, "exp_alerts": []},
        ],
        "promql_expr_test": [
            expression(keda_depth, at, ready),
            expression(keda_age, at, oldest),
            expression('sum(headrace_tasks{state="dead"})', at, dead),
            expression('max(headrace_tasks{state="dead"})', at, dead),
            expression('count(headrace_stage_oldest_age_seconds{stage="archive"})', at, 1),
            # a rule that keeps `instance`, as the docs' dead-letter alert did: it fires once
            expression('count(increase(headrace_attempts_total{outcome="dead"}[15m]) > 0)', at, 1),
            expression("sum(headrace_metrics_exporter)", at, 1),
            # the docs' p95 rule, near /v1/stages' p95
            expression(
                f"abs({P95} - {deployment.p95}) <= bool {near(deployment.p95)}",
                at,
                1,
                stage="render",
            ),
            # the gate advice: a refusal at the cap between the rounds, seen within 5 minutes
            expression("headrace:gate_refused_at_cap:rate5m > bool 0", "12m", 1, gate=GATE),
        ],
    }
    done = prometheus.run_rule_tests(tmp_path, RULES, case)
    assert done.returncode == 0, done.stdout + done.stderr


def alert(name: str, at: str, labels: dict[str, str], summary: str) -> dict[str, object]:
    expected = {"exp_labels": labels, "exp_annotations": {"summary": summary}}
    return {"alertname": name, "eval_time": at, "exp_alerts": [expected]}


def expression(promql: str, at: str, value: float, **labels: str) -> dict[str, object]:
    shown = prometheus.selector("", labels) if labels else "{}"
    return {"expr": promql, "eval_time": at, "exp_samples": [{"labels": shown, "value": value}]}


def test_a_task_dead_20_minutes_then_redriven_is_0_s_old_in_stages_and_metrics(
    deployment: Deployment,
) -> None:
    exporter = deployment.carrier()
    redriven = headrace("dlq", "retry", "--db", exporter.store, "--kind", "publish")
    assert redriven.returncode == 0, redriven.stderr
    stages = httpx.get(f"{exporter.url}/v1/stages", headers=exporter.auth("moderator")).json()
    [publish] = [stage for stage in stages["stages"] if stage["kind"] == "publish"]
    scraped = prometheus.scrape(exporter.url, exporter.auth("admin"))
    labels = {"stage": "publish", "class": "", "instance": scraped.instance, "job": prometheus.JOB}
    oldest = scraped.samples()[prometheus.selector("headrace_stage_oldest_age_seconds", labels)]
    print(f"dead {DEAD_FOR:.0f} s, then redriven: /v1/stages {publish['oldest_age']:.1f} s,")
    print(f"  /metrics {oldest:.1f} s")
    assert publish["ready"] == 3
    assert 0 <= publish["oldest_age"] < 5 and 0 <= oldest < 5, (publish, oldest)
    assert abs(publish["oldest_age"] - oldest) < 1 and abs(publish["p95_age"] - oldest) < 1


@pytest.mark.timeout(90)
def test_a_real_prometheus_reads_the_store_s_depth_and_p95_through_a_failover(
    tmp_path: Path,
) -> None:
    """Prometheus scrapes both processes every second; each holds the exporter's lease 3 s.
    The depth is the store's, the p95 of the histogram is near /v1/stages', and when the
    exporter is killed the other takes over with no moment counted twice."""
    prometheus.tool("prometheus")
    servers = start_two(tmp_path, "3s")
    try:
        now = time.time()
        clock = ManualClock(now - DEAD_FOR)
        asyncio.run(first_clip(tmp_path / "serve.db", clock))
        ready = asyncio.run(the_rest(tmp_path / "serve.db", clock, now))[TaskState.READY]
        targets = [s.url.removeprefix("http://") for s in servers]
        token = servers[0].tokens["admin"]
        with prometheus.running(tmp_path / "prom", targets, token, 1.0, RULES) as prom:
            depth = 'sum(headrace_stage_tasks{state="ready"})'
            prom.wait_for("count(up == 1) == 2", within=15.0)
            time.sleep(2.5)  # both scraped twice more
            assert prom.value(depth) == ready
            p95 = prom.wait_for(P95, within=5.0)
            exact = stages_p95(servers[0], "render")
            print(f"renders' p95 age: PromQL {p95:.1f} s, /v1/stages {exact:.1f} s")
            assert abs(p95 - exact) <= near(exact)
            found = prom.query("headrace_metrics_exporter == 1")
            [holder] = [s for s in servers if s.url.endswith(str(found[0]["metric"]["instance"]))]  # type: ignore[index]
            [other] = [s for s in servers if s is not holder]
            server.stop(holder, signal.SIGKILL)
            instance = other.url.removeprefix("http://")
            prom.wait_for(f'headrace_metrics_exporter{{instance="{instance}"}} == 1', within=15.0)
            assert prom.value(depth) == ready
            assert prom.value(f"max_over_time(({depth})[1m:250ms])") == ready
            print(f"ready tasks: the store's {ready}; Prometheus's sum over both processes {ready}")
    finally:
        for each in servers:
            server.stop(each)


def test_the_docs_rules_pass_promtool_check_rules() -> None:
    done = prometheus.check_rules(RULES)
    assert done.returncode == 0, done.stdout + done.stderr
