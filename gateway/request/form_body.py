"""Multipart form bodies (``/v1/audio/transcriptions`` and the like): the text fields a request
is routed, limited and metered on, and its ``model`` field rewritten in place for a pool that
serves the model under its own name. Everything else, files included, goes upstream as sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from python_multipart import MultipartParser
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import parse_options_header

from gateway.base.errors import BadRequest

if TYPE_CHECKING:
    from python_multipart.multipart import MultipartCallbacks

FORM = b"multipart/form-data"
MAX_TEXT_FIELD = 64 * 1024  # longer text fields are passed on, not read


@dataclass
class FormBody:
    """A multipart body as sent, with its text fields (files are not read)."""

    raw: bytes
    content_type: str  # the client's, with its boundary
    fields: dict[str, object] = field(default_factory=dict)  # the first value of each name
    model_span: tuple[int, int] | None = None  # where the model field's value is in ``raw``

    def with_model(self, model: str) -> bytes:
        """The body with its ``model`` field's value replaced."""
        if self.model_span is None:
            raise BadRequest("the form's model field cannot be rewritten", param="model")
        start, end = self.model_span
        return self.raw[:start] + model.encode() + self.raw[end:]


def is_form(content_type: str) -> bool:
    return parse_options_header(content_type)[0] == FORM


def parse_form(raw: bytes, content_type: str) -> FormBody:
    """The body's text fields; ``BadRequest`` for a body that is not the multipart form its
    content type says."""
    boundary = parse_options_header(content_type)[1].get(b"boundary")
    if not boundary:
        raise BadRequest("a multipart/form-data body needs a boundary in its content type")
    form = FormBody(raw, content_type)
    reader = _FieldReader(raw, form)
    parser = MultipartParser(boundary, reader.callbacks())
    try:
        parser.write(raw)
        parser.finalize()
    except MultipartParseError as exc:
        raise BadRequest(f"invalid multipart/form-data body: {exc}") from exc
    if not reader.ended:
        raise BadRequest("the multipart/form-data body ends before its closing boundary")
    return form


class _FieldReader:
    """The parser's callbacks: each part's name and whether it is a file, its text kept."""

    def __init__(self, raw: bytes, form: FormBody) -> None:
        self.raw, self.form = raw, form
        self.header_name = b""
        self.header_value = b""
        self.name: str | None = None
        self.spans: list[tuple[int, int]] = []
        self.contiguous = True
        self.ended = False

    def callbacks(self) -> MultipartCallbacks:
        return {
            "on_part_begin": self.part_begin,
            "on_header_field": self.header_field,
            "on_header_value": self.header_chars,
            "on_header_end": self.header_end,
            "on_part_data": self.data,
            "on_part_end": self.part_end,
            "on_end": self.end,
        }

    def part_begin(self) -> None:
        self.name, self.spans, self.contiguous = None, [], True
        self.header_name = self.header_value = b""

    def header_field(self, data: bytes, start: int, end: int) -> None:
        self.header_name += data[start:end]

    def header_chars(self, data: bytes, start: int, end: int) -> None:
        self.header_value += data[start:end]

    def header_end(self) -> None:
        if self.header_name.lower() == b"content-disposition":
            params = parse_options_header(self.header_value)[1]
            name = params.get(b"name")
            if name is not None and b"filename" not in params:  # a text field
                self.name = name.decode("utf-8", "replace")
        self.header_name = self.header_value = b""

    def data(self, data: bytes, start: int, end: int) -> None:
        if self.name is None:
            return
        if data is not self.raw:  # bytes the parser held back: not a span of the body
            self.contiguous = False
            self.spans.append((-1, -1))
        elif self.spans and self.spans[-1][1] == start:
            self.spans[-1] = (self.spans[-1][0], end)
        else:
            self.spans.append((start, end))

    def part_end(self) -> None:
        name, form = self.name, self.form
        if name is None or name in form.fields or len(self.spans) != 1 or not self.contiguous:
            return  # a file, a repeated name, or text the parser split: passed on unread
        start, end = self.spans[0]
        if end - start <= MAX_TEXT_FIELD:
            form.fields[name] = self.raw[start:end].decode("utf-8", "replace")
            if name == "model":
                form.model_span = (start, end)

    def end(self) -> None:
        self.ended = True
