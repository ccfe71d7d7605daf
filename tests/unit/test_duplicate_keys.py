"""The duplicate-key check of JSON bodies (``guards.reject_duplicate_keys``): the colon count
that lets a decoded body skip the second parse must never let a repeated key through."""

from __future__ import annotations

import json

import msgspec
import pytest

from dtq.entrypoints.api import guards
from dtq.entrypoints.api.guards import DuplicateKey, reject_duplicate_keys

REPEATED = [
    ('{"kind":"a","kind":"b"}', "kind"),
    ('{"kind":"a","payload":{"x":1,"y":2,"x":3}}', "payload.x"),
    ('{"tasks":[{"name":"a","kind":"k","name":"b"}]}', "tasks[0].name"),
    ('[{"a":1},{"b":{"c":1,"c":2}}]', "[1].b.c"),
    # a colon inside a string cannot make up for the repeated key's missing member
    ('{"kind":"a:b","kind":"c"}', "kind"),
    ('{"a:":1,"a:":2}', "a:"),
]


@pytest.mark.parametrize(("raw", "field"), REPEATED)
def test_a_repeated_key_is_refused_with_or_without_the_decoded_document(
    raw: str, field: str
) -> None:
    document = msgspec.json.decode(raw)
    for given in (None, document):
        with pytest.raises(DuplicateKey) as caught:
            reject_duplicate_keys(raw.encode(), given)
        assert caught.value.field == field


@pytest.mark.parametrize(
    "raw",
    [
        '{"kind":"noop"}',
        '{"kind":"a","payload":{"at":"2026-12-03T10:00:00Z","url":"http://x:80/"}}',
        '{"tasks":[{"name":"a","kind":"k"},{"name":"b","kind":"k","depends_on":["a"]}]}',
        '[1, "a:b", {"x": [{"y": {}}]}]',
        '{"k\\u003a":1}',
        "{}",
    ],
)
def test_a_body_without_a_repeated_key_passes(raw: str) -> None:
    reject_duplicate_keys(raw.encode(), msgspec.json.decode(raw))
    reject_duplicate_keys(raw.encode())


def test_a_body_whose_colons_match_its_members_is_not_parsed_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parsed: list[bytes] = []
    monkeypatch.setattr(json, "loads", lambda raw, **kw: parsed.append(raw))
    raw = b'{"kind":"a","payload":{"n":[1,{"m":2}]}}'

    reject_duplicate_keys(raw, msgspec.json.decode(raw))
    assert parsed == []
    reject_duplicate_keys(b'{"kind":"a:b"}', {"kind": "a:b"})  # a colon in a string
    assert parsed == [b'{"kind":"a:b"}']


def test_past_the_budget_the_body_is_parsed_again_and_still_checked() -> None:
    many = ", ".join(f'{{"i": {i}}}' for i in range(guards.MEMBER_COUNT_BUDGET + 1))
    raw = f'[{many}, {{"z": 1, "z": 2}}]'

    with pytest.raises(DuplicateKey) as caught:
        reject_duplicate_keys(raw.encode(), msgspec.json.decode(raw))
    assert caught.value.field == f"[{guards.MEMBER_COUNT_BUDGET + 1}].z"
