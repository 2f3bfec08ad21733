"""What the schema fuzzing (tests/api/test_fuzz.py, slow) leaves out, checked in every run."""

from __future__ import annotations

from fuzz_support import APP, EVENTS, schema


def test_the_document_lists_the_event_stream_that_the_fuzzing_leaves_out():
    document = APP.openapi()
    answer = document["paths"][EVENTS]["get"]["responses"]["200"]
    assert list(answer["content"]) == ["text/event-stream"]
    fuzzed = {result.ok().path for result in schema.get_all_operations()}
    assert EVENTS not in fuzzed and "/api/v1/sweeps/{sweep_id}" in fuzzed
