"""Multipart ``/v1/audio/*`` through the gateway with the official ``openai`` client: routed on the form's model, authenticated, the pool's model name written into
the form, the file passed byte for byte, streams relayed, broken forms refused.

The upstream is a small aiohttp server that answers with what it received: no engine here can
transcribe audio, and what is under test is the gateway's handling of the form."""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Callable

import aiohttp
import openai
import pytest
from aiohttp import web

from loadtest.harness.processes import KvgateProcess
from tests.http_servers import serving
from tests.integration.metrics_util import scrape

KEY = "sk-audio-test"
AUDIO = bytes(range(256)) * 64 + b"\r\n--boundary-lookalike\r\n" * 8


async def transcribe(request: web.Request) -> web.StreamResponse:
    form = await request.post()
    upload = form["file"]
    assert isinstance(upload, web.FileField)
    data = upload.file.read()
    seen = {
        "path": request.path,
        "fields": {k: v for k, v in form.items() if isinstance(v, str)},
        "file_sha256": hashlib.sha256(data).hexdigest(),
        "authorization": request.headers.get("authorization"),
    }
    if form.get("stream") == "true":
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        delta = {"object": "transcription.chunk", "choices": [{"delta": {"content": "hi"}}]}
        await response.write(f"data: {json.dumps(delta)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response
    return web.json_response({"text": json.dumps(seen)})


def echo_app() -> web.Application:
    app = web.Application(client_max_size=8 * 1024 * 1024)
    app.router.add_post("/v1/audio/transcriptions", transcribe)
    app.router.add_post("/v1/audio/translations", transcribe)
    return app


async def test_audio_forms_are_routed_rewritten_and_passed_through(
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
) -> None:
    async with serving(echo_app()) as port:
        url, _ = start_gateway(f"""
listen: {{max_body: 4MiB}}
pools:
  asr: {{model: whisper-large-v3, endpoints: ["127.0.0.1:{port}"], api_key: pool-secret}}
routes:
  - {{model: whisper, pool: asr, paths: [/v1/audio/transcriptions, /v1/audio/translations]}}
  - {{model: chat-only, pool: asr}}
auth: {{api_keys: [{{sha256: {hashlib.sha256(KEY.encode()).hexdigest()}, tenant: t}}]}}
""")
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
        result = await client.audio.transcriptions.create(
            model="whisper", file=("talk.wav", AUDIO, "audio/wav"), language="fr", prompt="Bonjour"
        )
        seen = json.loads(result.text)
        assert seen["path"] == "/v1/audio/transcriptions"
        assert seen["fields"]["model"] == "whisper-large-v3"  # the pool's name for the model
        assert seen["fields"]["language"] == "fr" and seen["fields"]["prompt"] == "Bonjour"
        assert seen["file_sha256"] == hashlib.sha256(AUDIO).hexdigest()  # byte for byte
        assert seen["authorization"] == "Bearer pool-secret"  # the client's key stays here
        with warnings.catch_warnings():  # the SDK marks translations deprecated
            warnings.simplefilter("ignore", DeprecationWarning)
            translated = await client.audio.translations.create(
                model="whisper", file=("talk.wav", AUDIO, "audio/wav")
            )
        assert json.loads(translated.text)["path"] == "/v1/audio/translations"

        stranger = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-wrong", max_retries=0)
        async with stranger, client:
            with pytest.raises(openai.AuthenticationError):
                await stranger.audio.transcriptions.create(model="whisper", file=("a.wav", AUDIO))
            with pytest.raises(openai.NotFoundError, match="not enabled"):
                await client.audio.transcriptions.create(model="chat-only", file=("a.wav", AUDIO))

        auth = {"Authorization": f"Bearer {KEY}"}
        async with aiohttp.ClientSession() as session:
            data = aiohttp.FormData()
            data.add_field("model", "whisper")
            data.add_field("stream", "true")
            data.add_field("file", AUDIO, filename="a.wav")
            async with session.post(
                f"{url}/v1/audio/transcriptions", data=data, headers=auth
            ) as response:
                assert response.status == 200
                assert response.headers["content-type"].startswith("text/event-stream")
                text = await response.text()
            assert text.endswith("data: [DONE]\n\n") and '"hi"' in text
            boundary = "x" * 20
            broken = f"--{boundary}\r\nContent-Disposition: form-data; name=model\r\n\r\nwhi"
            headers = {**auth, "content-type": f"multipart/form-data; boundary={boundary}"}
            async with session.post(
                f"{url}/v1/audio/transcriptions", data=broken.encode(), headers=headers
            ) as response:
                assert response.status == 400
                assert "closing boundary" in (await response.json())["error"]["message"]
            async with session.post(
                f"{url}/v1/chat/completions", data=broken.encode(), headers=headers
            ) as response:
                assert response.status == 400
                assert "takes a JSON body" in (await response.json())["error"]["message"]
        await client.close()
    requests = scrape(url)["kvgate_requests_total"]
    assert any(
        s.labels["route"] == "/v1/audio/transcriptions"
        and s.labels["model"] == "whisper"
        and s.labels["status"] == "200"
        for s in requests
    )
