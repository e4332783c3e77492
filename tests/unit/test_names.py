"""canonical_name / kind_of: one key per Gemini resource, whatever the spelling."""

from __future__ import annotations

import dataclasses

import pytest

from opstate.domain.names import (
    MAX_NAME_LENGTH,
    InvalidNameError,
    Kind,
    ParsedName,
    api_name,
    canonical_name,
    kind_of,
    legacy_names,
    parse_name,
)

HOST = "https://generativelanguage.googleapis.com"
VEO = "models/veo-3.1-generate-preview/operations/abc123"
VEO_KEY = "models/-/operations/abc123"  # a video operation's key never depends on its model
FSI = "fileSearchStores/store-1/operations/op-9"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        # already canonical
        ("batches/x", "batches/x"),
        (VEO, VEO_KEY),
        (FSI, FSI),
        ("interactions/int_1", "interactions/int_1"),
        ("operations/o.1~a-b_c", "operations/o.1~a-b_c"),
        # full URLs
        (f"{HOST}/v1beta/batches/x", "batches/x"),
        (f"{HOST}/v1/batches/x", "batches/x"),
        (f"{HOST}/v1beta/{VEO}", VEO_KEY),
        (f"{HOST}/v1beta/{FSI}", FSI),
        (f"{HOST}/batches/x", "batches/x"),
        ("http://127.0.0.1:8080/v1beta/batches/x", "batches/x"),
        ("HTTPS://generativelanguage.googleapis.com/v1beta/batches/x", "batches/x"),
        (f"{HOST}/v1beta/batches/x?alt=json", "batches/x"),
        (f"{HOST}/v1beta/batches/x:cancel?alt=json&key=k", "batches/x"),
        (f"{HOST}/v1beta/batches/x#frag", "batches/x"),
        # API version prefixes, with or without a leading slash
        ("v1/batches/x", "batches/x"),
        ("v1beta/batches/x", "batches/x"),
        ("v1beta1/batches/x", "batches/x"),
        ("v1alpha/batches/x", "batches/x"),
        ("/v1beta/batches/x", "batches/x"),
        ("/v1alpha/" + VEO, VEO_KEY),
        ("/batches/x", "batches/x"),
        # trailing :verb and query strings
        ("batches/x:cancel", "batches/x"),
        ("batches/x:get", "batches/x"),
        (VEO + ":cancel", VEO_KEY),
        ("v1beta/batches/x:cancel", "batches/x"),
        ("batches/x?alt=json", "batches/x"),
        ("batches/x:cancel?alt=json", "batches/x"),
        # surrounding whitespace is not part of a name
        ("  batches/x\n", "batches/x"),
        # a version-looking segment that is not the first one is part of the name
        ("batches/v1", "batches/v1"),
        # names are case-sensitive
        ("batches/AbC", "batches/AbC"),
    ],
)
def test_canonical_name_spellings(raw: str, expected: str) -> None:
    assert canonical_name(raw) == expected
    # canonical is a fixed point
    assert canonical_name(expected) == expected


@pytest.mark.parametrize(
    ("raw", "hint", "expected"),
    [
        ("x", Kind.BATCH, "batches/x"),
        ("x", "batch", "batches/x"),
        ("abc-123_z", Kind.BATCH, "batches/abc-123_z"),
        ("x:cancel", Kind.BATCH, "batches/x"),
        ("/x", Kind.BATCH, "batches/x"),
        ("v1beta/x", Kind.BATCH, "batches/x"),
        ("int_1", Kind.INTERACTION, "interactions/int_1"),
        ("int_1", "interaction", "interactions/int_1"),
        # a hint never changes a name that already names its collection
        ("batches/x", Kind.BATCH, "batches/x"),
        (VEO, Kind.BATCH, VEO_KEY),
        ("batches/x", Kind.VIDEO, "batches/x"),
        ("batches/x", "no-such-kind", "batches/x"),
    ],
)
def test_bare_ids_take_the_hinted_collection(raw: str, hint: Kind | str, expected: str) -> None:
    assert canonical_name(raw, hint) == expected


@pytest.mark.parametrize(
    ("raw", "hint"),
    [
        ("x", None),
        ("x", Kind.OPERATION),
        ("x", Kind.FILE_SEARCH_IMPORT),
        ("x", "no-such-kind"),
    ],
)
def test_bare_id_without_a_collection_hint_is_rejected(raw: str, hint: Kind | str | None) -> None:
    with pytest.raises(InvalidNameError) as info:
        canonical_name(raw, hint)
    assert info.value.why


@pytest.mark.parametrize(
    "raw",
    [
        # empty
        "",
        "   ",
        "/",
        "//",
        "?alt=json",
        ":cancel",
        HOST,
        HOST + "/",
        HOST + "/v1beta/",
        # empty, '.' or '..' segments
        "batches//x",
        "batches/x/",
        "batches/../x",
        "batches/./x",
        "../batches/x",
        "batches/..",
        "batches/:cancel",
        # characters outside A-Z a-z 0-9 . _ ~ - /
        "batches/x y",
        "batches/x%2F",
        "batches/x+y",
        "batches/x@y",
        "batches/ü",
        "batches/x\ty",
        "batches\\x",
        "models/veo:predict/operations/x",
        "gs://bucket/x",
        # too long
        "batches/" + "a" * (MAX_NAME_LENGTH - len("batches/") + 1),
        "b" * 5000,
    ],
)
def test_canonical_name_rejects(raw: str) -> None:
    with pytest.raises(InvalidNameError) as info:
        canonical_name(raw, Kind.BATCH)
    assert info.value.value == raw
    assert info.value.why
    assert str(info.value).startswith("invalid operation name")


@pytest.mark.parametrize("raw", [None, 1, b"batches/x", ["batches/x"], {"name": "batches/x"}])
def test_canonical_name_rejects_non_strings(raw: object) -> None:
    with pytest.raises(InvalidNameError) as info:
        canonical_name(raw)
    assert info.value.value is raw


def test_length_limit_is_on_the_canonical_name() -> None:
    longest = "batches/" + "a" * (MAX_NAME_LENGTH - len("batches/"))
    assert len(longest) == MAX_NAME_LENGTH
    assert canonical_name(longest) == longest
    # a URL spelling of it is longer than 512 characters but names the same resource
    assert canonical_name(f"{HOST}/v1beta/{longest}:cancel?alt=json") == longest
    # a bare id that only overflows once its collection is added is rejected
    with pytest.raises(InvalidNameError, match="longer than 512"):
        canonical_name("a" * (MAX_NAME_LENGTH - len("batches/") + 1), Kind.BATCH)


def test_long_names_are_shortened_in_the_message() -> None:
    with pytest.raises(InvalidNameError) as info:
        canonical_name("x" * 2000)
    assert len(str(info.value)) < 300
    assert info.value.value == "x" * 2000


def test_invalid_name_error_is_a_value_error() -> None:
    assert issubclass(InvalidNameError, ValueError)


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("batches/x", Kind.BATCH),
        ("interactions/int_1", Kind.INTERACTION),
        (VEO, Kind.VIDEO),
        (VEO_KEY, Kind.VIDEO),
        ("models/veo-2.0-generate-001/operations/o", Kind.VIDEO),
        (FSI, Kind.FILE_SEARCH_IMPORT),
        ("fileSearchStores/s/upload/operations/o", Kind.FILE_SEARCH_IMPORT),
        ("fileSearchStores/s", Kind.OPERATION),
        ("operations/o", Kind.OPERATION),
        ("models/gemini-2.5-pro/operations/o", Kind.OPERATION),
        ("tunedModels/t/operations/o", Kind.OPERATION),
        ("jobs/0123abcd", Kind.JOB),
    ],
)
def test_kind_of(name: str, kind: Kind) -> None:
    assert kind_of(name) is kind


def test_kind_values_are_stable_strings() -> None:
    assert {k.value for k in Kind} == {
        "batch",
        "video",
        "interaction",
        "file_search_import",
        "operation",
        "job",
    }


# ---------------------------------------------------------------- video keys


@pytest.mark.parametrize(
    ("raw", "hint", "model"),
    [
        (VEO, None, "veo-3.1-generate-preview"),
        (f"{HOST}/v1beta/{VEO}?alt=json", None, "veo-3.1-generate-preview"),
        ("models/veo-2.0-generate-001/operations/abc123", Kind.VIDEO, "veo-2.0-generate-001"),
        (VEO_KEY, None, None),
        ("abc123", Kind.VIDEO, None),  # a webhook's bare data.id
        ("operations/abc123", Kind.VIDEO, None),
        ("abc123", "video", None),
    ],
)
def test_a_video_operation_has_one_key_with_or_without_its_model(
    raw: str, hint: Kind | str | None, model: str | None
) -> None:
    parsed = parse_name(raw, hint)
    assert parsed == ParsedName(VEO_KEY, model)
    assert canonical_name(raw, hint) == VEO_KEY
    assert kind_of(parsed.key) is Kind.VIDEO


def test_polling_rebuilds_the_full_name_and_old_records_keep_theirs() -> None:
    assert api_name(VEO_KEY, {"model": "veo-3.1-generate-preview"}) == VEO
    assert legacy_names(VEO_KEY, {"model": "veo-3.1-generate-preview"}) == (VEO,)
    # without a usable model there is nothing to rebuild and no older key
    for details in ({}, {"model": 3}, {"model": "gemini-2.5"}, {"model": "veo/../x"}):
        assert api_name(VEO_KEY, details) == VEO_KEY
        assert legacy_names(VEO_KEY, details) == ()
    # other kinds are asked for by their key
    assert api_name("batches/x", {"model": "veo-3"}) == "batches/x"
    assert legacy_names("batches/x", {"model": "veo-3"}) == ()
    assert api_name(VEO, {"model": "veo-3"}) == VEO


def test_a_non_video_model_operation_keeps_its_model() -> None:
    assert parse_name("models/gemini-2.5-pro/operations/o") == ParsedName(
        "models/gemini-2.5-pro/operations/o", None
    )
    assert canonical_name("operations/o") == "operations/o"
    assert canonical_name("operations/o", Kind.BATCH) == "operations/o"


# ---------------------------------------------------------------- pinned parsing details


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        # the first '?' or '#' ends the path, whatever follows
        ("batches/x?a=1?b=2", "batches/x"),
        ("batches/x#frag#more", "batches/x"),
        ("batches/x?q#f", "batches/x"),
        # the first ':' of the last segment starts the verb
        ("batches/x:cancel:now", "batches/x"),
        ("batches/x:a:b:c", "batches/x"),
    ],
)
def test_query_fragment_and_verb_split_at_the_first_separator(raw: str, expected: str) -> None:
    assert canonical_name(raw) == expected


def test_a_bare_id_that_looks_like_an_api_version_is_an_id() -> None:
    # "v1" alone is not stripped as a version prefix: it is the only segment.
    assert canonical_name("v1", Kind.BATCH) == "batches/v1"
    assert canonical_name("v1beta", Kind.INTERACTION) == "interactions/v1beta"
    assert canonical_name("v1/v1", Kind.BATCH) == "batches/v1"


def test_raw_input_over_1024_characters_is_refused_even_if_it_would_shrink() -> None:
    longest_raw = f"{HOST}/v1beta/batches/x?" + "a" * (2 * MAX_NAME_LENGTH)
    assert len(longest_raw) > 2 * MAX_NAME_LENGTH
    with pytest.raises(InvalidNameError, match="longer than 512 characters"):
        canonical_name(longest_raw)
    at_limit = "batches/x?" + "a" * (2 * MAX_NAME_LENGTH - len("batches/x?"))
    assert len(at_limit) == 2 * MAX_NAME_LENGTH
    assert canonical_name(at_limit) == "batches/x"


@pytest.mark.parametrize(
    ("raw", "hint", "message"),
    [
        (None, None, "invalid operation name None: expected a string"),
        ("  ", None, "invalid operation name '  ': empty"),
        (
            "x",
            None,
            "invalid operation name 'x': a bare id names no collection (expected e.g. "
            "'batches/<id>')",
        ),
        (
            "batches/a b",
            None,
            "invalid operation name 'batches/a b': only A-Z a-z 0-9 . _ ~ - and / are allowed",
        ),
        (
            "batches/../x",
            None,
            "invalid operation name 'batches/../x': empty, '.' or '..' path segment",
        ),
        (
            "x",
            "nope",
            "invalid operation name 'nope': unknown kind hint; expected one of batch, "
            "video, interaction, file_search_import, operation, job",
        ),
        (
            "b" * 2000,
            None,
            "invalid operation name '" + "b" * 77 + "...': longer than 512 characters",
        ),
    ],
)
def test_error_messages_users_see(raw: object, hint: str | None, message: str) -> None:
    with pytest.raises(InvalidNameError) as info:
        canonical_name(raw, hint)
    assert str(info.value) == message


def test_a_parsed_name_is_an_immutable_value() -> None:
    parsed = parse_name(VEO)
    with pytest.raises(dataclasses.FrozenInstanceError):
        parsed.key = "x"  # type: ignore[misc]
    assert not hasattr(parsed, "__dict__")  # slots
    assert parsed == ParsedName(VEO_KEY, "veo-3.1-generate-preview")


def test_messages_show_up_to_80_characters_of_the_value() -> None:
    for length, shown in ((80, "b" * 80), (81, "b" * 77 + "...")):
        with pytest.raises(InvalidNameError) as info:
            canonical_name("b" * length)
        assert str(info.value).startswith(f"invalid operation name {shown!r}: ")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("/?a", "invalid operation name '/?a': empty"),
        ("v1beta/:get", "invalid operation name 'v1beta/:get': empty"),
        (
            "models/veo!/operations/x",
            "invalid operation name 'models/veo!/operations/x': only A-Z a-z 0-9 . _ ~ - and / "
            "are allowed",
        ),
        (
            "batches/" + "a" * 505,
            "invalid operation name '" + ("batches/" + "a" * 505)[:77] + "...': longer than 512 "
            "characters",
        ),
    ],
)
def test_more_messages_users_see(raw: str, message: str) -> None:
    with pytest.raises(InvalidNameError) as info:
        canonical_name(raw)
    assert str(info.value) == message


def test_a_two_segment_veo_name_is_a_video() -> None:
    assert kind_of("models/veo-3") is Kind.VIDEO
    assert kind_of("models") is Kind.OPERATION
