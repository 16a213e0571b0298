"""KV events on a ZMQ SUB socket, decoded as a vLLM subscriber would."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable
from typing import Any

import msgpack
import openai
import zmq

from loadtest.harness.processes import free_port
from tests.fakes import close_after_test


def subscribe(port: int) -> zmq.Socket[bytes]:
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    sock.connect(f"tcp://127.0.0.1:{port}")
    return sock


Event = dict[str, Any]  # one event as msgpack decodes it: a tagged map


def read_events(sock: zmq.Socket[bytes], want: int) -> list[tuple[bytes, int, list[Event]]]:
    batches = []
    total = 0
    while total < want:
        topic, seq, payload = sock.recv_multipart()
        ts, events, rank = msgpack.unpackb(payload)  # strictly three, as vLLM's engines send
        assert isinstance(ts, float) and rank == 0
        batches.append((topic, int.from_bytes(seq, "big"), events))
        total += len(events)
    return batches


def test_block_stored_and_removed(start_backend: Callable[..., str]) -> None:
    events_port = free_port()
    url = start_backend(
        "--kv-events-port",
        str(events_port),
        "--num-blocks",
        "8",
        "--max-model-len",
        "128",
        "--cost",
        "zero",
    )
    sock = subscribe(events_port)
    api = close_after_test(openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0))
    prompt = list(range(40, 40 + 48))  # 3 full blocks, the last one left to compute
    time.sleep(0.3)  # ZMQ slow joiner: let the subscription reach the publisher first
    api.completions.create(model="kvgate-sim", prompt=prompt, max_tokens=1)
    (topic, seq, events), *_ = read_events(sock, 1)
    assert topic == f"kv@127.0.0.1:{url.rsplit(':', 1)[1]}@kvgate-sim".encode()
    stored = events[0]
    assert stored["type"] == "BlockStored"  # a tagged map, as vLLM 0.32 sends
    hashes, parent, token_ids = (
        stored["block_hashes"],
        stored["parent_block_hash"],
        stored["token_ids"],
    )
    assert stored["block_size"] == 16 and stored["medium"] == "GPU"
    assert stored["lora_id"] is None and stored["lora_name"] is None
    assert parent is None and len(hashes) == len(token_ids) // 16
    assert token_ids == prompt[: len(hashes) * 16]
    assert all(isinstance(h, int) and 0 <= h < 2**64 for h in hashes)
    # Fill the 8-block cache with other prompts: the first prompt's blocks get evicted.
    for start in (100, 150):
        api.completions.create(
            model="kvgate-sim", prompt=list(range(start, start + 64)), max_tokens=1
        )
    later = read_events(sock, 3)
    kinds = [e["type"] for _, _, batch in later for e in batch]
    assert "BlockRemoved" in kinds
    removed = {
        h
        for _, _, batch in later
        for e in batch
        if e["type"] == "BlockRemoved"
        for h in e["block_hashes"]
    }
    assert removed & set(hashes)
    seqs = [seq] + [s for _, s, _ in later]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    sock.close(linger=0)


def test_the_host_tier_publishes_its_blocks_and_serves_hits(
    start_backend: Callable[..., str],
) -> None:
    events_port = free_port()
    url = start_backend(
        "--kv-events-port", str(events_port), "--num-blocks", "8", "--max-model-len", "128",
        "--cost", "zero", "--cpu-offload-blocks", "32",
    )  # fmt: skip
    sock = subscribe(events_port)
    api = close_after_test(openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0))
    time.sleep(0.3)  # ZMQ slow joiner
    prompt = list(range(40, 40 + 49))  # 3 full blocks and a token
    api.completions.create(model="kvgate-sim", prompt=prompt, max_tokens=1)
    (_, _, (stored, *_)), *_ = read_events(sock, 1)
    for start in (100, 150):  # evict its blocks from the device
        api.completions.create(
            model="kvgate-sim", prompt=list(range(start, start + 64)), max_tokens=1
        )
    events = [e for _, _, batch in read_events(sock, 4) for e in batch]
    on_host = {h for e in events if e["medium"] == "CPU" for h in e["block_hashes"]}
    assert on_host >= set(stored["block_hashes"])  # offloaded as they left the device
    cpu = next(e for e in events if e["medium"] == "CPU" and e["type"] == "BlockStored")
    assert len(cpu["token_ids"]) == 16 * len(cpu["block_hashes"])
    again = api.completions.create(model="kvgate-sim", prompt=prompt, max_tokens=1)
    details = again.usage.prompt_tokens_details if again.usage else None
    assert details is not None and details.cached_tokens == 48  # restored, not recomputed
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        metrics = response.read().decode()
    assert 'kvgate:host_cache_hits_total{engine="0",model_name="kvgate-sim"} 48.0' in metrics
    assert "kvgate:host_cache_blocks" in metrics
    sock.close(linger=0)
