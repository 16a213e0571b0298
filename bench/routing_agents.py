"""The agentic workloads of ``make bench-routing``: coding-agent sessions
(``loadtest.workloads.agentic``) of 8-14 calls over two agents' shared system prompts (1,500
tokens with their tool schemas), each call appending a tool result of about 150 tokens after a
tool pause of 1 s on average, 80 sessions arriving 4 a second, every call streamed to its end
(the run lasts until the last session's last call). The sessions' live KV peaks at about twice
the engines' device tier (reported per run: ``live_kv_ratio``). ``agentic-host`` gives every
engine a host tier twice its device's (``kvgate backend --cpu-offload-blocks``).

Reported besides the usual: TTFT p90 of each session's second call and of its later calls (the
sixth on): a router that keeps a session's history cached keeps the later calls as fast as the
second.
"""

from __future__ import annotations

from collections import defaultdict

from loadtest.reports.records import RequestRecord
from loadtest.reports.stage_report import Stage
from loadtest.reports.stats import percentile
from loadtest.workloads.agentic import AgentShape, agentic
from loadtest.workloads.chats import Chain

AGENT_WORKLOADS = ("agentic", "agentic-host")
SESSIONS = 80
SESSION_RATE = 4.0  # sessions arriving per second
SHAPE = AgentShape(
    agents=2, system_chars=1500, min_calls=8, max_calls=14, tool_chars=150, answer_chars=32,
    pause=1.0,
)  # fmt: skip
LATER_CALL = 5  # calls from the sixth on are "later"


def agent_chains(seed: int) -> list[Chain]:
    return agentic(SESSIONS, SHAPE, seed)


def agent_stages() -> list[Stage]:
    """Sessions arrive at ``SESSION_RATE`` until all have started; the run lasts until the
    last one ends."""
    return [Stage(rate=SESSION_RATE * SHAPE.mean_calls)]


def host_blocks(name: str, device_blocks: int) -> int:
    """The host tier of each engine in workload ``name`` (0: none)."""
    return 2 * device_blocks if name == "agentic-host" else 0


def agent_row(records: list[RequestRecord], device_tokens: int) -> dict[str, float]:
    """TTFT p90 of second and later calls, and the live sessions' KV at its peak ÷ the
    engines' device tier (each session's context beyond its system prompt, the prompts once)."""
    ok = [r for r in records if r.ok]
    second = [r.ttft * 1000 for r in ok if r.call == 1]
    later = [r.ttft * 1000 for r in ok if r.call >= LATER_CALL]
    return {
        "ttft_p90_second_call_ms": percentile(second, 90),
        "ttft_p90_later_calls_ms": percentile(later, 90),
        "live_kv_ratio": _peak_live_kv(ok) / device_tokens if device_tokens else 0.0,
    }


def _peak_live_kv(records: list[RequestRecord]) -> float:
    """The most KV the sessions held at once: each session, from its first call to its last
    call's end, holds its latest call's context (prompt and answer)."""
    by_session: dict[str, list[RequestRecord]] = defaultdict(list)
    for record in records:
        by_session[record.group].append(record)
    shared = SHAPE.system_chars  # one system prompt per agent, counted once
    changes: list[tuple[float, float]] = []
    for calls in by_session.values():
        calls.sort(key=lambda r: r.start)
        held = 0.0
        for record in calls:
            context = record.prompt_tokens + record.output_tokens - shared
            changes.append((record.start, context - held))
            held = context
        last = calls[-1]
        changes.append((last.start + last.latency, -held))
    live = peak = 0.0
    for _, change in sorted(changes):
        live += change
        peak = max(peak, live)
    return peak + SHAPE.agents * shared
