"""The demo's processes: N fresh backends (caches cold) and a gateway in front of them with
one routing policy. Each child logs to a file; one that fails to start is reported with the
end of its log. Every child is stopped when the stack closes, also on Ctrl-C and SIGTERM
(``main`` turns SIGTERM into an exception), and on Linux each is told to end when the demo's
process dies, so even ``kill -9`` of the demo leaves nothing behind."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from loadtest.harness.processes import KvgateProcess, backend_process, free_port, gateway_process


@dataclass(frozen=True)
class DemoOptions:
    backends: int
    runner: str
    num_blocks: int
    workdir: Path


def share_cores(options: DemoOptions) -> None:
    """torch backends: split the machine's cores between them (``OMP_NUM_THREADS``, read by
    the children), instead of each starting a thread per core and all of them thrashing."""
    if options.runner == "torch" and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // options.backends))


def _backend_args(options: DemoOptions) -> list[str]:
    if options.runner == "torch":
        return ["--preset", "tiny", "--seed", "0", "--num-blocks", str(options.num_blocks)]
    return ["--cost", "default", "--num-blocks", str(options.num_blocks)]


def policy_text(endpoints: list[str], picker: str, model: str) -> str:
    listed = ", ".join(endpoints)
    return (
        f"pools: {{demo: {{endpoints: [{listed}]}}}}\n"
        f"routes: [{{model: {model}, pool: demo}}]\n"
        f"epp: {{picker: {picker}}}\n"
        'observability: {access_log: "off"}\n'
    )


@contextmanager
def running_stack(options: DemoOptions, picker: str, model: str) -> Iterator[tuple[str, list[str]]]:
    """(gateway URL, backend URLs), all serving until the block ends."""
    ports = [free_port() for _ in range(options.backends)]
    gateway_port = free_port()
    share_cores(options)
    logs = options.workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        for number, port in enumerate(ports):
            child = backend_process(
                port,
                *_backend_args(options),
                model=model,
                runner=options.runner,
                log=str(logs / f"{picker}-backend-{number}.log"),
            )
            _start(stack, child, 120.0 if options.runner == "torch" else 20.0)
        policy = options.workdir / f"policy-{picker}.yaml"
        policy.write_text(policy_text([f"127.0.0.1:{p}" for p in ports], picker, model))
        gateway = gateway_process(
            str(policy), gateway_port, log=str(logs / f"{picker}-gateway.log")
        )
        _start(stack, gateway, 20.0)
        yield f"http://127.0.0.1:{gateway_port}", [f"http://127.0.0.1:{p}" for p in ports]


def _start(stack: ExitStack, child: KvgateProcess, timeout: float) -> None:
    """Start ``child`` (ending with this process on Linux); ``stack`` stops it."""
    child.end_with_parent = True
    stack.callback(child.stop)
    child.start(timeout)
