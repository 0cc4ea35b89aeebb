"""The one server-sent-event reader (jobs/sse.py) that the load driver, the watch canary and the
simulated engine's test load share."""

from __future__ import annotations

from soakmatrix.jobs.sse import DONE, data_payload


def test_a_data_line_gives_its_payload_whatever_the_spacing_or_type():
    assert data_payload('data: {"choices": []}\n') == '{"choices": []}'
    assert data_payload(b'data:{"a": 1}\r\n') == '{"a": 1}'
    assert data_payload(b"data: [DONE]\n") == DONE == "[DONE]"


def test_other_lines_carry_no_payload():
    for line in ("", "\n", ": keep-alive", "event: message", "id: 3", b"retry: 10", "  "):
        assert data_payload(line) is None


def test_a_bad_byte_does_not_raise():
    assert data_payload(b"data: \xff\n") == "\ufffd"
