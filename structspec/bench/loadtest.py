"""A bounded, loopback-only load test: requests/s and latency percentiles per concurrency level,
and a check that every request either succeeded or failed with a gRPC status (none lost).

    from structspec.bench.loadtest import run_load
    report = run_load("127.0.0.1:50051", concurrency_levels=(1, 8, 32), requests_per_level=64)
    print(report.table())
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

from structspec.client import NO_RETRY, AsyncClient, StructSpecError, TLSConfig

MAX_CONCURRENCY = 256
MAX_REQUESTS_PER_LEVEL = 10_000
DEFAULT_TEXT = "Hi, I'm Ada Lovelace from Analytical Engines Ltd. Reach me at ada@example.com or +44 20 7946 0958."


class LoadTestError(AssertionError):
    """A request ended without a result or a status, or the counts do not add up."""


@dataclass(frozen=True)
class LevelReport:
    concurrency: int
    requests: int
    ok: int
    failures: dict[str, int]  # status code name -> count
    seconds: float
    requests_per_second: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    output_tokens: int = 0

    @property
    def failed(self) -> int:
        return sum(self.failures.values())


@dataclass(frozen=True)
class LoadReport:
    target: str
    levels: list[LevelReport] = field(default_factory=list)

    def table(self) -> str:
        rows = [f"{'conc':>5} {'reqs':>6} {'ok':>6} {'failed':>6} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}  failures"]
        for lv in self.levels:
            fails = ", ".join(f"{k}={v}" for k, v in sorted(lv.failures.items())) or "-"
            rows.append(
                f"{lv.concurrency:>5} {lv.requests:>6} {lv.ok:>6} {lv.failed:>6} {lv.requests_per_second:>8.1f} "
                f"{lv.p50_ms:>8.1f} {lv.p99_ms:>8.1f} {lv.max_ms:>8.1f}  {fails}"
            )
        return "\n".join(rows)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


def check_loopback(target: str) -> None:
    host = target.rsplit(":", 1)[0].strip("[]") if ":" in target else target
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror as exc:
        raise ValueError(f"cannot resolve {host!r}: {exc}") from None
    addresses = {str(info[4][0]) for info in infos}
    if not addresses or not all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses):
        raise ValueError(f"load tests run against loopback only; {host!r} resolves to {sorted(addresses)}")


async def _level(client: AsyncClient, concurrency: int, n: int, request: dict[str, Any], timeout: float) -> LevelReport:
    latencies: list[float] = []
    codes: Counter[str] = Counter()
    lost: list[str] = []
    tokens = 0
    todo = iter(range(n))

    async def worker() -> None:
        nonlocal tokens
        for _ in todo:
            t0 = time.perf_counter()
            try:
                result = await client.extract_result(timeout=timeout, **request)
            except StructSpecError as exc:
                codes[exc.code.name] += 1
            except Exception as exc:  # no status: a lost request
                lost.append(f"{type(exc).__name__}: {exc}")
            else:
                latencies.append(time.perf_counter() - t0)
                tokens += result.usage.output_tokens

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    seconds = time.perf_counter() - started
    if lost:
        raise LoadTestError(f"{len(lost)} of {n} requests failed without a status, e.g. {lost[0]}")
    if len(latencies) + sum(codes.values()) != n:
        raise LoadTestError(f"{n} requests sent, {len(latencies)} ok + {sum(codes.values())} failed")
    ms = [x * 1000 for x in latencies]
    return LevelReport(
        concurrency, n, len(latencies), dict(codes), seconds, n / seconds if seconds > 0 else 0.0,
        percentile(ms, 50), percentile(ms, 99), max(ms, default=0.0), tokens,
    )


async def run_load_async(
    target: str,
    concurrency_levels: Sequence[int] = (1, 8, 32),
    requests_per_level: int = 64,
    *,
    schema_id: str = "contact",
    text: str = DEFAULT_TEXT,
    max_tokens: int | None = None,
    token: str | None = None,
    tls: bool | TLSConfig | None = None,
    timeout: float = 60.0,
) -> LoadReport:
    check_loopback(target)
    if not 1 <= requests_per_level <= MAX_REQUESTS_PER_LEVEL:
        raise ValueError(f"requests_per_level must be in [1, {MAX_REQUESTS_PER_LEVEL}]")
    if not concurrency_levels or any(not 1 <= c <= MAX_CONCURRENCY for c in concurrency_levels):
        raise ValueError(f"each concurrency level must be in [1, {MAX_CONCURRENCY}]")
    request: dict[str, Any] = {"text": text, "schema_id": schema_id}
    if max_tokens is not None:
        request["max_tokens"] = max_tokens
    report = LoadReport(target)
    async with AsyncClient(target, token=token, tls=tls, retry=NO_RETRY) as client:
        for concurrency in concurrency_levels:
            report.levels.append(await _level(client, concurrency, requests_per_level, request, timeout))
    return report


def run_load(target: str, concurrency_levels: Sequence[int] = (1, 8, 32), requests_per_level: int = 64, **kwargs: Any) -> LoadReport:
    """Blocking wrapper of ``run_load_async`` (must not be called from a running event loop)."""
    return asyncio.run(run_load_async(target, concurrency_levels, requests_per_level, **kwargs))
