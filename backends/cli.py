"""``kvgate backend``: run the reference model server, on the simulated or the torch runner.

``--runner torch`` loads a local HF model folder (``--model-path``) or random weights of a size
preset (``--preset``); torch is imported only then (the ``backend`` extra).
"""

from __future__ import annotations

import argparse
import logging

from aiohttp import web

from backends.engine.build import EngineConfig, build_engine
from backends.engine.scheduler import SchedulerConfig
from backends.engine.speculation import SpeculativeConfig
from backends.kv_publisher import ZmqEventPublisher
from backends.pd import worker as pd_worker
from backends.runner_parts import RunnerParts
from backends.runners.sim_runner import CostModel, SimRunner
from backends.server.app import create_app
from backends.server.metrics import ServerMetrics
from backends.server.state import ServerState
from backends.server.tracing import RequestTracer
from kvgate.wire import app_logging
from kvgate.wire.http.tls import server_context
from kvgate.wire.request_tokenizer import ReferenceTokenizer

log = logging.getLogger("kvgate.backend")
TORCH_EXTRA = frozenset({"torch", "safetensors"})  # what the backend extra installs


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "backend",
        help="run the reference vLLM-compatible model server",
        description="A vLLM-compatible OpenAI server on kvgate's paged-KV engine.",
    )
    p.add_argument(
        "--runner", choices=["sim", "torch"], default="sim", help="how steps are computed"
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--ssl-certfile", help="serve HTTPS with this certificate chain (PEM)")
    p.add_argument("--ssl-keyfile", help="the certificate's private key (PEM)")
    p.add_argument(
        "--otlp-traces-endpoint",
        help="send each request's spans (queue, prefill, decode) to this OTLP/HTTP collector "
        "URL, e.g. http://127.0.0.1:4318/v1/traces (vLLM's flag)",
    )
    p.add_argument(
        "--model",
        help="served model name (default: kvgate-sim, the --model-path, or kvgate-PRESET)",
    )
    _torch_options(p)
    _engine_options(p)
    _kv_event_options(p)
    _sim_options(p)
    pd_worker.add_arguments(p)
    p.set_defaults(func=run)


def _torch_options(p: argparse.ArgumentParser) -> None:
    torch_group = p.add_argument_group("torch runner")
    torch_group.add_argument(
        "--model-path", help="local HF model folder (config.json, *.safetensors)"
    )
    torch_group.add_argument("--preset", choices=["tiny", "small"], help="random weights of a size")
    torch_group.add_argument("--dtype", default="auto", help="auto, float32, bfloat16, float16")
    torch_group.add_argument("--device", default="auto", help="auto (cuda when present), cpu, cuda")
    torch_group.add_argument(
        "--kv-cache-memory",
        default="0.1",
        help="KV-cache memory: a size (512MiB, 2GB) or a fraction of free memory (0.1)",
    )
    torch_group.add_argument("--max-lora-rank", type=int, default=64)
    torch_group.add_argument(
        "--plain-matmul",
        action="store_true",
        help="plain torch matmuls for the projections, not oneDNN's packed weights (CPU)",
    )
    torch_group.add_argument(
        "--engine-process",
        action="store_true",
        help="run the model in a child process (default: a thread of the server process)",
    )
    torch_group.add_argument(
        "--tokenizer", help="tokenizer folder (default: the model folder's, else bytes)"
    )


def _engine_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--num-blocks", type=int, default=4096, help="KV-cache blocks")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument(
        "--max-num-batched-tokens",
        type=int,
        help="tokens computed in one step (default: 2048 for the torch runner on a CPU, as "
        "vLLM's CPU server; else 4096; at least --max-model-len without chunked prefill)",
    )
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--no-chunked-prefill", action="store_true")
    p.add_argument("--no-prefix-caching", action="store_true")
    host = p.add_mutually_exclusive_group()
    host.add_argument(
        "--cpu-offload-blocks",
        type=int,
        default=0,
        help="a host tier of this many blocks: evicted blocks' KV is kept there and restored "
        "on a prefix hit (published as KV events with medium CPU)",
    )
    p.add_argument(
        "--kv-retention-fraction",
        type=float,
        default=0.5,
        help="the share of KV blocks requests' kv.retain hints may keep cached at once (0: none)",
    )
    p.add_argument(
        "--kv-retention-owner-fraction",
        type=float,
        default=0.25,
        help="the share one owner (a tenant, as the gateway names it) may keep",
    )
    host.add_argument(
        "--kv-offloading-size",
        type=float,
        default=0.0,
        help="the host tier's size in GiB of the runner's KV, as vLLM's flag",
    )
    p.add_argument("--max-loras", type=int, default=1, help="adapters resident at once")
    p.add_argument(
        "--lora-modules", nargs="*", default=[], metavar="NAME=PATH", help="adapters at start-up"
    )


def _kv_event_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--kv-events-port", type=int, help="publish KV events (ZMQ PUB bound on --host:PORT)"
    )
    p.add_argument(
        "--kv-events-endpoint",
        help="or publish on this ZMQ endpoint, as vLLM: tcp://*:PORT binds, tcp://HOST:PORT "
        "connects (to a subscriber bound there)",
    )
    p.add_argument(
        "--kv-events-replay-port",
        type=int,
        help="serve missed batches (ZMQ ROUTER) on this port (default: the events port + 1; "
        "0: none)",
    )
    p.add_argument(
        "--kv-events-topic", help="ZMQ topic (default kv@HOST:PORT@MODEL, llm-d's convention)"
    )


def _sim_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cost",
        default="default",
        help="sim cost model: 'default', 'zero', or seconds a,b,c,d[,e[,f]] for "
        "step, prefill token, decode seq, KV token read, LoRA swap, block restored",
    )
    p.add_argument(
        "--speculative-config",
        help="speculative decoding, as vLLM's: JSON such as "
        '\'{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}\'',
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the simulated tokens")
    p.add_argument("--default-max-tokens", type=int, default=256, help="chat default max_tokens")


def build_state(args: argparse.Namespace) -> ServerState:
    """Everything the server needs, from parsed arguments (raises ValueError on bad values)."""
    if args.runner == "torch":
        from backends.torch_backend import build_torch_parts

        parts = build_torch_parts(args)
    else:
        parts = _sim_parts(args)
    kv_events = args.kv_events_port is not None or args.kv_events_endpoint is not None
    max_model_len = min(args.max_model_len, parts.max_model_len or args.max_model_len)
    budget = args.max_num_batched_tokens
    if budget is None:  # without chunks a whole prompt must fit in a step, as vLLM sizes it
        budget = parts.max_num_batched_tokens
        budget = budget if not args.no_chunked_prefill else max(budget, max_model_len)
    config = EngineConfig(
        SchedulerConfig(
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=budget,
            max_model_len=max_model_len,
            enable_chunked_prefill=not args.no_chunked_prefill,
            max_loras=args.max_loras,
            eos_token_ids=parts.eos_token_ids,
            speculative=(
                SpeculativeConfig.parse(args.speculative_config)
                if args.speculative_config
                else None
            ),
        ),
        num_blocks=args.num_blocks,
        block_size=args.block_size,
        enable_prefix_caching=not args.no_prefix_caching,
        record_events=kv_events,
        host_blocks=args.cpu_offload_blocks,
        host_bytes=int(args.kv_offloading_size * 2**30),
        retention_fraction=_fraction(args.kv_retention_fraction, "--kv-retention-fraction"),
        retention_owner_fraction=_fraction(
            args.kv_retention_owner_fraction, "--kv-retention-owner-fraction"
        ),
    )
    model_name = args.model or parts.model_name
    sink = None
    if kv_events:
        topic = args.kv_events_topic or f"kv@{args.host}:{args.port}@{model_name}"
        explicit = args.kv_events_replay_port
        replay = explicit if explicit is not None else _default_replay(args.kv_events_port)
        sink = ZmqEventPublisher(
            args.kv_events_endpoint or f"tcp://{args.host}:{args.kv_events_port}",
            topic,
            replay_endpoint=f"tcp://{args.host}:{replay}" if replay else None,
            bind=None if args.kv_events_endpoint else True,
            replay_optional=explicit is None,
        )
    connector = pd_worker.make_connector(args, parts.runner)
    engine = build_engine(config, parts.runner, kv_connector=connector, event_sink=sink)
    metrics = ServerMetrics(engine, model_name, args.max_loras)
    engine.observer = metrics
    pd = None if connector is None else pd_worker.attach(connector, engine, metrics.registry, args)
    state = ServerState(
        engine,
        parts.tokenizer,
        model_name,
        metrics,
        max_loras=args.max_loras,
        chat_max_tokens=args.default_max_tokens,
        vocab_size=parts.vocab_size,
        role=args.role,
        pd=connector,
        transfer_server=None if pd is None else pd.server,
        prefill_timeout=args.prefill_timeout,
    )
    if args.otlp_traces_endpoint:
        state.tracer = RequestTracer.otlp(args.otlp_traces_endpoint, model_name)
    for module in args.lora_modules:
        name, sep, path = module.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--lora-modules {module!r}: expected NAME=PATH")
        parts.load_lora(name, path)
        state.lora_adapters[name] = path
    return state


def _fraction(value: float, flag: str) -> float:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{flag} must be between 0 and 1; got {value}")
    return value


def _default_replay(events_port: int | None) -> int | None:
    """The replay port of a backend that names none: its events port + 1 (where a picker
    looks by default)."""
    return events_port + 1 if events_port and events_port < 65535 else None


def _sim_parts(args: argparse.Namespace) -> RunnerParts:
    tokenizer = ReferenceTokenizer()
    runner = SimRunner(
        tokenizer.printable_ids(),
        CostModel.parse(args.cost),
        seed=args.seed,
        max_loras=args.max_loras,
    )
    return RunnerParts(runner, tokenizer, "kvgate-sim", tokenizer.eos_token_ids)


def run(args: argparse.Namespace) -> int:
    app_logging.configure()
    try:
        state = build_state(args)
    except ValueError as exc:
        log.error("invalid configuration: %s", exc)
        return 2
    except ImportError as exc:
        if (exc.name or "").split(".")[0] not in TORCH_EXTRA:
            raise  # not the torch runner's: the command names what failed
        log.error("--runner torch needs %s: pip install 'kvgate[backend]' (%s)", exc.name, exc)
        return 2
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        log.info("uvloop not available; using the default event loop")
    tls = None
    if args.ssl_certfile or args.ssl_keyfile:
        if not (args.ssl_certfile and args.ssl_keyfile):
            log.error("--ssl-certfile and --ssl-keyfile go together")
            return 2
        tls = server_context(args.ssl_certfile, args.ssl_keyfile)
    app = create_app(state)
    scheme = "https" if tls else "http"
    log.info("serving %s on %s://%s:%d", state.model_name, scheme, args.host, args.port)
    web.run_app(
        app,
        host=args.host,
        port=args.port,
        ssl_context=tls,
        handler_cancellation=True,
        access_log=None,
        print=None,
    )
    return 0
