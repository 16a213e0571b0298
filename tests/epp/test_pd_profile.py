"""The PD profile: a decode pick, plus a prefill pick when the uncached prompt is long enough."""

from __future__ import annotations

from epp.framework import SchedulingRequest
from epp.service import EppService
from policies.loader import load_policy_text

POLICY = """
pools:
  pd:
    pd: {min_uncached_tokens: 64}
    endpoints:
      - {address: 127.0.0.2:1, role: prefill}
      - {address: 127.0.0.2:2, role: decode}
      - {address: 127.0.0.2:3, role: decode}
routes: [{model: m, pool: pd}]
"""


def request(text: str, rid: str) -> SchedulingRequest:
    return SchedulingRequest(rid, "m", text, body={"prompt": text})


def test_long_uncached_prompt_gets_a_prefill_endpoint() -> None:
    service = EppService(load_policy_text(POLICY))
    long_prompt = "a distinct long prompt " * 40  # ~230 tokens at 4 chars per token
    decode, prefill = service.pick_pd("pd", request(long_prompt, "r1"))
    assert decode.target is not None and decode.target.role == "decode"
    assert prefill is not None and prefill.role == "prefill"
    # the same prompt again: the decode endpoint now holds it, nothing long is left to compute
    again, prefill_again = service.pick_pd("pd", request(long_prompt + " more", "r2"))
    assert again.target is decode.target and prefill_again is None


def test_short_prompt_or_no_pd_config_means_decode_only() -> None:
    service = EppService(load_policy_text(POLICY))
    decode, prefill = service.pick_pd("pd", request("short", "r1"))
    assert decode.target is not None and decode.target.role == "decode" and prefill is None
    plain = EppService(
        load_policy_text(POLICY.replace("pd: {min_uncached_tokens: 64}", "model: x"))
    )
    assert plain.pick_pd("pd", request("a distinct long prompt " * 40, "r1"))[1] is None
