"""A YAML spec with a character YAML does not allow (a control character: PyYAML's reader refuses
it while the loader is being built, before any parsing) is a 422 naming `spec` and the
character, not a 500 (found by schemathesis on the populated server, tests/test_surface.py)."""

from __future__ import annotations

import pytest

from service.documents import load_yaml
from service.errors import InvalidInput


@pytest.mark.parametrize("text", ["O\x14", "name: a\x07b\n", "\x00"])
def test_a_control_character_is_invalid_input_naming_the_spec(text):
    with pytest.raises(InvalidInput) as exc:
        load_yaml(text)
    assert exc.value.field == "spec"
    assert "YAML syntax error" in exc.value.message and "#x00" in exc.value.message


def test_a_plain_document_still_reads():
    assert load_yaml("name: a\nseeds: 2\n") == {"name": "a", "seeds": 2}
