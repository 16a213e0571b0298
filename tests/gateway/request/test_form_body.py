"""Multipart form bodies (``/v1/audio/*``): text fields read, files left alone, the
model field rewritten in place, broken bodies refused with a clear error."""

from __future__ import annotations

import pytest

from gateway.base.errors import BadRequest
from gateway.request.form_body import is_form, parse_form

BOUNDARY = "----kvgate7f3a"
CONTENT_TYPE = f"multipart/form-data; boundary={BOUNDARY}"
AUDIO = b"RIFF\r\n--\r\n----kvgate7f3\x00\xff" * 100  # almost-boundaries inside the file


def form(*parts: tuple[str, bytes, str | None]) -> bytes:
    out = b""
    for name, value, filename in parts:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        out += f"--{BOUNDARY}\r\nContent-Disposition: {disposition}\r\n".encode()
        if filename:
            out += b"Content-Type: audio/wav\r\n"
        out += b"\r\n" + value + b"\r\n"
    return out + f"--{BOUNDARY}--\r\n".encode()


BODY = form(
    ("file", AUDIO, "a.wav"),
    ("model", b"whisper", None),
    ("language", "fran\u00e7ais".encode(), None),
    ("model", b"second", None),
)


def test_text_fields_are_read_and_files_are_not() -> None:
    parsed = parse_form(BODY, CONTENT_TYPE)
    assert parsed.fields == {"model": "whisper", "language": "fran\u00e7ais"}  # first wins
    assert is_form(CONTENT_TYPE) and not is_form("application/json")


def test_the_model_is_rewritten_in_place_and_nothing_else_changes() -> None:
    rewritten = parse_form(BODY, CONTENT_TYPE).with_model("whisper-large-v3")
    assert rewritten == BODY.replace(b"\r\n\r\nwhisper\r\n", b"\r\n\r\nwhisper-large-v3\r\n", 1)
    again = parse_form(rewritten, CONTENT_TYPE)
    assert again.fields["model"] == "whisper-large-v3" and AUDIO in rewritten


@pytest.mark.parametrize(
    ("body", "content_type", "message"),
    [
        (BODY, "multipart/form-data", "needs a boundary"),
        (BODY[: len(BODY) // 2], CONTENT_TYPE, "ends before its closing boundary"),
        (b"not a form at all", CONTENT_TYPE, "invalid multipart"),
    ],
)
def test_broken_forms_are_refused(body: bytes, content_type: str, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        parse_form(body, content_type)


def test_a_form_without_a_model_cannot_be_rewritten() -> None:
    with pytest.raises(BadRequest, match="model field"):
        parse_form(form(("file", AUDIO, "a.wav")), CONTENT_TYPE).with_model("x")
