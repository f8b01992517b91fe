"""Prometheus's own tools on what `headrace serve` exposes: `promtool check metrics` on a scrape,
`promtool test rules` on series built from real scrapes (each labelled with the `instance` and
`job` Prometheus would add), and a real Prometheus server scraping API processes, asked over
its HTTP API. Debian's `prometheus` package has both programs (`.ci/run` installs it); without
them these tests skip, saying why, and fail when `CI` is set."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.services import unavailable

JOB = "headrace"
STEP = 60  # seconds between the samples of a promtool test's series


def tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        unavailable(f"{name} is not installed (Debian package prometheus)", "the Prometheus tests")
    return found


@dataclass(frozen=True)
class Scrape:
    """One scrape of one API process: `instance` as Prometheus names its target."""

    instance: str
    text: str

    def samples(self) -> dict[str, float]:
        """Every sample as a series selector (with `instance` and `job`), to its value."""
        found: dict[str, float] = {}
        for family in text_string_to_metric_families(self.text):
            for sample in family.samples:
                labels = {**sample.labels, "instance": self.instance, "job": JOB}
                found[selector(sample.name, labels)] = float(sample.value)
        return found


def selector(name: str, labels: Mapping[str, str]) -> str:
    inner = ",".join(f"{key}={json.dumps(value)}" for key, value in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def scrape(url: str, headers: Mapping[str, str]) -> Scrape:
    answer = httpx.get(f"{url}/metrics", headers=dict(headers), timeout=10.0)
    assert answer.status_code == 200, answer.text
    return Scrape(urlsplit(url).netloc, answer.text)


def check_metrics(text: str) -> subprocess.CompletedProcess[str]:
    """`promtool check metrics` on an exposition: 0 and nothing printed when it is clean."""
    return subprocess.run(
        [tool("promtool"), "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def check_rules(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("promtool"), "check", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def input_series(rounds: Sequence[Sequence[Scrape]], minutes: int) -> list[dict[str, str]]:
    """promtool's input series from rounds of scrapes, each round held for `minutes` minutes
    of the test's time (one sample a minute): a series a round lacks is missing (`_`) then."""
    by_round = [{k: v for s in scrapes for k, v in s.samples().items()} for scrapes in rounds]
    names = sorted({name for found in by_round for name in found})
    series = []
    for name in names:
        values = [_held(found.get(name), minutes) for found in by_round]
        series.append({"series": name, "values": " ".join(values)})
    return series


def _held(value: float | None, minutes: int) -> str:
    shown = "_" if value is None else repr(value)
    return " ".join([shown] * minutes)


def run_rule_tests(
    directory: Path, rule_file: Path, case: Mapping[str, object]
) -> subprocess.CompletedProcess[str]:
    """`promtool test rules` on one case (input series, alerts and expressions expected) over
    `rule_file`; the test file is JSON, which is YAML."""
    tests = directory / "rules_test.json"
    document = {
        "rule_files": [str(rule_file)],
        "evaluation_interval": f"{STEP}s",
        "tests": [{"interval": f"{STEP}s", **case}],
    }
    tests.write_text(json.dumps(document, indent=1))
    return subprocess.run(
        [tool("promtool"), "test", "rules", str(tests)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    """A Prometheus server on a free local port, its data in a scratch directory."""

    process: subprocess.Popen[str]
    url: str
    log: Path

    def query(self, promql: str) -> list[dict[str, object]]:
        """The instant vector `promql` evaluates to now."""
        answer = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=10.0)
        body = answer.json()
        assert body["status"] == "success", body
        result: list[dict[str, object]] = body["data"]["result"]
        return result

    def value(self, promql: str) -> float | None:
        """The one value `promql` gives now (None: no series)."""
        found = self.query(promql)
        assert len(found) <= 1, found
        if not found:
            return None
        sample = found[0]["value"]
        assert isinstance(sample, list)
        return float(sample[1])

    def wait_for(self, promql: str, within: float) -> float:
        """The value `promql` gives once it gives one; fails after `within` seconds."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            found = self.value(promql)
            if found is not None:
                return found
            time.sleep(0.2)
        raise AssertionError(f"{promql}: no value within {within} s\n{self.log.read_text()}")


@contextlib.contextmanager
def running(
    directory: Path, targets: Sequence[str], token: str, every: float, rules: Path
) -> Iterator[Server]:
    """Prometheus scraping `targets` (host:port) every `every` seconds with an admin token, and
    evaluating `rules` as often."""
    interval = f"{int(every * 1000)}ms"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "token").write_text(token)
    config = {
        "global": {
            "scrape_interval": interval,
            "scrape_timeout": interval,
            "evaluation_interval": interval,
        },
        "rule_files": [str(rules)],
        "scrape_configs": [
            {
                "job_name": JOB,
                "authorization": {"credentials_file": str(directory / "token")},
                "static_configs": [{"targets": list(targets)}],
            }
        ],
    }
    (directory / "prometheus.json").write_text(json.dumps(config))
    port = free_port()
    log = directory / "prometheus.log"
    with log.open("w") as output:
        process = subprocess.Popen(
            [
                tool("prometheus"),
                f"--config.file={directory / 'prometheus.json'}",
                f"--storage.tsdb.path={directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
        )
    server = Server(process, f"http://127.0.0.1:{port}", log)
    try:
        _wait_ready(server)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_ready(server: Server, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        assert server.process.poll() is None, server.log.read_text()
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{server.url}/-/ready", timeout=2.0).status_code == 200:
                return
        time.sleep(0.2)
    raise AssertionError(f"prometheus did not start:\n{server.log.read_text()}")
