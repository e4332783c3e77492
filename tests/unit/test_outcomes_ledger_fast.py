"""The ledger's fast ways (msgspec into the ``ledger_rows`` structs; without msgspec, one decode
per block and the JSON scanner run in place) count exactly what ``json.loads`` of each line
alone counts, for any bytes, however they are cut."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from opstate.outcomes import ledger as ledger_module
from opstate.outcomes.ledger import BatchLedger
from opstate.outcomes.ledger_reading import DETAIL_FIELDS, DETAIL_KEYS, USAGE_FIELDS
from tests.support.outcomes import chunked


class Bad(Exception):
    """A value that is no count: its row is unreadable (issue 47)."""


def _count(value: object) -> int:
    """A count: null or missing 0, an int of 0..2**63-1, or 1-19 ASCII digits of one."""
    if value is None:
        return 0
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63:
        return value
    digits = isinstance(value, str) and 0 < len(value) < 20 and set(value) <= set("0123456789")
    if digits and int(str(value)) < 2**63:
        return int(str(value))
    raise Bad(value)


def _details(usage: dict[str, Any]) -> dict[tuple[str, str], int]:
    """The per-modality counts by (list, modality); another modality is OTHER."""
    found: dict[tuple[str, str], int] = {}
    for name in DETAIL_FIELDS:
        items = usage.get(name)
        if items is None:
            continue
        if not isinstance(items, list):
            raise Bad(items)
        for item in items:
            if not isinstance(item, dict):
                raise Bad(item)
            modality = item.get("modality")
            if modality not in ("TEXT", "IMAGE", "AUDIO", "VIDEO", "DOCUMENT"):
                modality = "OTHER"
            key = (name, str(modality))
            found[key] = found.get(key, 0) + _count(item.get("tokenCount"))
    return found


def _code(status: dict[str, Any]) -> str:
    code = status.get("code")
    if isinstance(code, int | str) and not isinstance(code, bool) and str(code).strip():
        return str(code).strip()
    return "unknown"


# google-genai's FinishReason names of a refusal by a policy (issue 39 added the image ones
# and the filters; NO_IMAGE, IMAGE_OTHER, OTHER are answers: docs/results.md)
BLOCKING = (
    "SAFETY",
    "PROHIBITED_CONTENT",
    "BLOCKLIST",
    "SPII",
    "RECITATION",
    "IMAGE_SAFETY",
    "IMAGE_PROHIBITED_CONTENT",
    "IMAGE_RECITATION",
    "MODEL_ARMOR",
    "ESCALATION",
    "PUP_LIMITED_DISABLED",
)


def _blocked(response: dict[str, Any]) -> bool:
    """The rule written out again: a block reason (a non-empty string), no candidates (missing,
    null or empty), or candidates that all are objects finishing for a blocking reason."""
    feedback = response.get("promptFeedback")
    reason = feedback.get("blockReason") if isinstance(feedback, dict) else None
    if isinstance(reason, str) and reason != "":
        return True
    candidates = response.get("candidates")
    if candidates is None or candidates == []:
        return True
    return isinstance(candidates, list) and all(
        isinstance(c, dict)
        and isinstance(c.get("finishReason"), str)
        and c["finishReason"] in BLOCKING
        for c in candidates
    )


def reference(data: bytes) -> dict[str, Any]:
    """Counts by the definition: each line alone through ``json.loads``."""
    rows = {"total": 0, "succeeded": 0, "blocked": 0, "failed": 0, "unreadable": 0}
    errors: dict[str, int] = {}
    usage = dict.fromkeys(USAGE_FIELDS, 0)
    details = dict.fromkeys(DETAIL_KEYS, 0)
    for raw in data.split(b"\n"):
        if not raw or raw.isspace():
            continue
        rows["total"] += 1
        try:
            row = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError):
            row = None
        if not isinstance(row, dict):
            rows["unreadable"] += 1
        elif isinstance(row.get("response"), dict):
            meta = row["response"].get("usageMetadata")
            meta = meta if isinstance(meta, dict) else {}
            try:
                counts = [_count(meta.get(key)) for key in USAGE_FIELDS]
                found = _details(meta)
            except Bad:
                rows["unreadable"] += 1
                continue
            rows["succeeded"] += 1
            rows["blocked"] += _blocked(row["response"])
            for key, n in zip(USAGE_FIELDS, counts, strict=True):
                usage[key] += n
            for key, n in found.items():
                details[key] += n
        else:
            status = row.get("status")
            status = status if isinstance(status, dict) else row.get("error")
            if isinstance(status, dict):
                rows["failed"] += 1
                errors[_code(status)] = errors.get(_code(status), 0) + 1
            else:
                rows["unreadable"] += 1
    return {"rows": rows, "errors": errors, "usage": usage, "details": details}


def band_details(ledger: BatchLedger) -> dict[tuple[str, str], int]:
    """The ledger's per-modality sums over all its bands."""
    sums = dict.fromkeys(DETAIL_KEYS, 0)
    for band in ledger.bands.values():
        for key, n in zip(DETAIL_KEYS, band[1 + len(USAGE_FIELDS) :], strict=True):
            sums[key] += n
    return sums


# Lines near the fast path's edges: values that end before the line does, run past it, or
# are not what they look like.
TRICKY = [
    b'{"response": {"usageMetadata": {"totalTokenCount": 5}}}',
    b'{"response": {"usageMetadata": {"totalTokenCount": 5}}} ',
    b'{"response": {"usageMetadata": {"totalTokenCount": 5}}}\r',
    b'{"response": {"usageMetadata": {"totalTokenCount": 5}}}x',
    b'{"response": {"usageMetadata": {"totalTokenCount": 5}}}{"status": {"code": 3}}',
    b'{"response": {"usageMetadata":',
    b' {"totalTokenCount": 4}}}',
    b'{"response": {}, "response": 1, "status": {"code": 9}}',
    b'{"status": {"code": 8}, "status": 2, "error": {"code": "7 "}}',
    b'{"response": {"usageMetadata": {"promptTokenCount": "12", "thoughtsTokenCount": 2.0,'
    b' "totalTokenCount": true, "candidatesTokenCount": -3, "cachedContentTokenCount": 1e400}}}',
    b'{"response": {"usageMetadata": {"totalTokenCount": NaN}}}',
    # Per-modality counts (issue 47), well formed or not.
    b'{"response": {"usageMetadata": {"promptTokenCount": 20, "candidatesTokenCount": 1120,'
    b' "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 20}],'
    b' "candidatesTokensDetails": [{"modality": "IMAGE", "tokenCount": 1120}]}}}',
    b'{"response": {"usageMetadata": {"cacheTokensDetails": [{"modality": "AUDIO",'
    b' "tokenCount": "7"}, {"modality": "AUDIO", "tokenCount": 1}, {"tokenCount": 2}]}}}',
    b'{"response": {"usageMetadata": {"toolUsePromptTokensDetails": [{"modality": 3,'
    b' "tokenCount": 4}, {"modality": "MODALITY_UNSPECIFIED", "tokenCount": 5}]}}}',
    b'{"response": {"usageMetadata": {"promptTokensDetails": null,'
    b' "candidatesTokensDetails": []}}}',
    b'{"response": {"usageMetadata": {"promptTokensDetails": {}}}}',
    b'{"response": {"usageMetadata": {"promptTokensDetails": [null]}}}',
    b'{"response": {"usageMetadata": {"promptTokensDetails": [{"tokenCount": -1}]}}}',
    b'{"response": {"usageMetadata": {"promptTokensDetails": [{"tokenCount": 1.5}]}}}',
    b'{"response": {"usageMetadata": {"promptTokenCount": "\\u00b2"}}}',
    b'{"response": {"usageMetadata": {"promptTokenCount": "99999999999999999999"}}}',
    b'{"response": {"usageMetadata": {"promptTokenCount": 9223372036854775807}}}',
    b'{"response": {"text": "a\x01b"}}',
    b'{"response": {"text": "\\ud800\\n\\"\\u00e9"}}',
    '{"response": {"text": "é\u2028"}}'.encode(),
    b'{"response": {"text": "\xff"}}',
    b'\x0c{"response": {}}',
    b'\t{"response": {}}',
    b"{",
    b"{}",
    b"[1, 2]",
    b'"text"',
    b"   ",
    b"\x0b",
    b"",
    # What msgspec reads differently unless the ledger rules it out or reads it the slow way:
    b'{"response": {}, "skipped": "\xff\xfe"}',  # invalid UTF-8 in a value msgspec skips
    b'{"response": {}, "skipped": "\xed\xa0\x80"}',  # an encoded surrogate
    b'{"response": {}, "skipped": "\\udc00"}',
    b'{"response": {}} {"status": {"code": 1}}',  # two values on one line
    b'{"response": {}, "x": [1,}',  # a syntax error inside a skipped value
    b'{"response": {}, "x": [' + b"[" * 200 + b"]" * 200 + b"]}",
    b'{"response": 5, "response": {"usageMetadata": {"totalTokenCount": 2}}}',
    b'{"response": {"usageMetadata": {"totalTokenCount": 2}}, "response": null}',
    b'{"respons\\u0065": {"usageMetadata": {"totalTokenC\\u006funt": 3}}}',
    b'{"response": {"usageMetadata": {"totalTokenCount": 123456789012345678901234567890}}}',
    b'{"response": {"usageMetadata": {"totalTokenCount": 18446744073709551616}}}',
    b'{"response": {"usageMetadata": {"totalTokenCount": 12345678901234567890.0}}}',
    b'{"response": {"usageMetadata": {"totalTokenCount": -0, "promptTokenCount": -0.0}}}',
    b'{"response": {"usageMetadata": {"promptTokenCount": "\\u0031\\u0032"}}}',
    b'{"response": {"usageMetadata": {"promptTokenCount": "\xd9\xa3"}}}',  # Arabic-Indic 3
    b'{"status": {"code": 1.0}}',
    b'{"status": {"code": " 5"}, "error": {"code": 6}}',
    b'{"status": null, "error": {"code": 6}}',
    b'{"status": "quota", "error": {"code": 6}}',
    b'{"response": null, "status": {}}',
    b'{"response": {"usageMetadata": null}}',
    b'{"response": {"usageMetadata": []}}',
    b'\xef\xbb\xbf{"response": {}}',
    b'{"response": {}}\x00',
    # Blocked or not: what promptFeedback, candidates and finishReason hold, of any type.
    b'{"response": {"candidates": [{"finishReason": "STOP"}]}}',
    b'{"response": {"candidates": [{"finishReason": "SAFETY", "content": {"parts": []}}]}}',
    b'{"response": {"candidates": [{"finishReason": "SAFETY"}, {"finishReason": "STOP"}]}}',
    b'{"response": {"candidates": [{"finishReason": "RECITATION"}, {"finishReason": "SPII"}]}}',
    b'{"response": {"candidates": [{"finishReason": "BLOCKLIST"}, {}]}}',
    b'{"response": {"candidates": [{"finishReason": "PROHIBITED_CONTENT"}]}}',
    b'{"response": {"candidates": [{"finishReason": "IMAGE_SAFETY"}]}}',
    b'{"response": {"candidates": [{"finishReason": "NO_IMAGE", "content": {"role": "model"}}]}}',
    b'{"response": {"candidates": [{"finishReason": "IMAGE_OTHER"}, {"finishReason": "OTHER"}]}}',
    b'{"response": {"candidates": [{"finishReason": "safety"}]}}',
    b'{"response": {"candidates": [{"finishReason": "S\\u0041FETY"}]}}',
    b'{"response": {"candidates": [{"finishReason": null}]}}',
    b'{"response": {"candidates": [{"finishReason": 3}]}}',
    b'{"response": {"candidates": [{"finishReason": ["SAFETY"]}]}}',
    b'{"response": {"candidates": [{"finishReason": {"SAFETY": 1}}]}}',
    b'{"response": {"candidates": [null]}}',
    b'{"response": {"candidates": ["SAFETY"]}}',
    b'{"response": {"candidates": []}}',
    b'{"response": {"candidates": null}}',
    b'{"response": {"candidates": {}}}',
    b'{"response": {"candidates": "none"}}',
    b'{"response": {"candidates": 0}}',
    b'{"response": {"candidates": [{"finishReason": "STOP"}], "candidates": []}}',
    b'{"response": {"promptFeedback": {"blockReason": "SAFETY"}}}',
    b'{"response": {"promptFeedback": {"blockReason": "OTHER"},'
    b' "candidates": [{"finishReason": "STOP"}]}}',
    b'{"response": {"promptFeedback": {"blockReason": ""}, "candidates": [{}]}}',
    b'{"response": {"promptFeedback": {"blockReason": null}, "candidates": [{}]}}',
    b'{"response": {"promptFeedback": {"blockReason": 1}, "candidates": [{}]}}',
    b'{"response": {"promptFeedback": {"blockReason": true}, "candidates": []}}',
    b'{"response": {"promptFeedback": "SAFETY", "candidates": [{}]}}',
    b'{"response": {"promptFeedback": [], "candidates": [{}]}}',
    b'{"response": {"promptFeedback": null, "candidates": [{"finishReason": "STOP"}]}}',
    b'{"response": {"promptFeedback": {"blockReason": "\\ud800"}, "candidates": [{}]}}',
]
# Responses shaped as Gemini's, blocked or not, with a wrong type here and there.
reasons = st.one_of(
    st.sampled_from([*BLOCKING, "STOP", "MAX_TOKENS", ""]), st.none(), st.integers()
)
candidate = st.one_of(
    st.fixed_dictionaries({}, optional={"finishReason": reasons, "index": st.integers(0, 3)}),
    st.none(),
    st.sampled_from(BLOCKING),
)
response = st.fixed_dictionaries(
    {},
    optional={
        "candidates": st.one_of(st.lists(candidate, max_size=3), st.none(), st.just({})),
        "promptFeedback": st.one_of(
            st.fixed_dictionaries({}, optional={"blockReason": reasons}), st.just("SAFETY")
        ),
        "usageMetadata": st.fixed_dictionaries({}, optional={"totalTokenCount": st.integers()}),
    },
)
lines = st.lists(
    st.one_of(
        st.sampled_from(TRICKY),
        st.builds(lambda r: json.dumps({"key": "k", "response": r}).encode(), response),
        st.text(alphabet='{}[]":,\\ \t\r01-eEnrstuaNI.é\x01', max_size=40).map(str.encode),
        st.builds(
            lambda which, value: json.dumps({which: value}).encode(),
            st.sampled_from(["response", "status", "error", "key"]),
            st.recursive(
                st.none()
                | st.booleans()
                | st.integers()
                | st.floats()
                | st.text(max_size=5)
                | st.sampled_from([*BLOCKING, "STOP", "OTHER", "NO_IMAGE", "IMAGE_OTHER", ""]),
                lambda inner: (
                    st.lists(inner, max_size=3)
                    | st.dictionaries(
                        st.sampled_from(
                            [
                                "code",
                                "usageMetadata",
                                *USAGE_FIELDS,
                                *DETAIL_FIELDS,
                                "modality",
                                "tokenCount",
                                "promptFeedback",
                                "blockReason",
                                "candidates",
                                "finishReason",
                                "x",
                            ]
                        ),
                        inner,
                        max_size=4,
                    )
                ),
                max_leaves=8,
            ),
        ),
    ),
    max_size=25,
)


@settings(max_examples=500, deadline=None)
@given(lines, st.lists(st.integers(min_value=0), max_size=12), st.booleans())
@example(TRICKY, [], True)
@example(TRICKY, [7, 100, 333], False)
@example([t for t in TRICKY if t.decode("utf-8", "replace").encode() == t], [], True)
@pytest.mark.parametrize("use_msgspec", [True, False], ids=["msgspec", "stdlib"])
def test_the_fast_ways_count_what_json_loads_of_each_line_counts(
    use_msgspec: bool, rows: list[bytes], cuts: list[int], trailing: bool
) -> None:
    data = b"\n".join(rows) + (b"\n" if trailing else b"")
    ledger = BatchLedger(use_msgspec=use_msgspec)
    for piece in chunked(data, cuts):
        ledger.feed(piece)
    ledger.finish()
    expected = reference(data)
    assert ledger.rows.as_dict() == expected["rows"]
    assert ledger.errors == expected["errors"]
    assert ledger.usage == expected["usage"]
    assert band_details(ledger) == expected["details"]
    assert (ledger.size, ledger.sha256) == (len(data), hashlib.sha256(data).hexdigest())


# Responses as Gemini writes them, every field of the type the structs take: msgspec reads each
# line itself (none goes to ``line``), so its own rule for ``blocked`` is what is compared.
well_typed_candidate = st.fixed_dictionaries(
    {},
    optional={
        "finishReason": st.one_of(st.sampled_from([*BLOCKING, "STOP", "MAX_TOKENS"]), st.none()),
        "content": st.just({"parts": [{"text": "an answer"}], "role": "model"}),
    },
)
well_typed_response = st.fixed_dictionaries(
    {},
    optional={
        "candidates": st.one_of(st.lists(well_typed_candidate, max_size=3), st.none()),
        "promptFeedback": st.fixed_dictionaries(
            {},
            optional={
                "blockReason": st.one_of(st.sampled_from(["SAFETY", "OTHER", ""]), st.none())
            },
        ),
        "usageMetadata": st.fixed_dictionaries(
            {},
            optional={
                "totalTokenCount": st.integers(min_value=0, max_value=10**6),
                "candidatesTokensDetails": st.lists(
                    st.fixed_dictionaries(
                        {
                            "modality": st.sampled_from(["TEXT", "IMAGE", "AUDIO", "NEW"]),
                            "tokenCount": st.integers(min_value=0, max_value=10**6),
                        }
                    ),
                    max_size=2,
                ),
            },
        ),
    },
)


@settings(max_examples=300, deadline=None)
@given(st.lists(well_typed_response, max_size=20))
@pytest.mark.parametrize("use_msgspec", [True, False], ids=["msgspec", "stdlib"])
def test_blocked_rows_are_counted_the_same_by_every_way(
    use_msgspec: bool, responses: list[dict[str, Any]]
) -> None:
    data = b"".join(
        json.dumps({"key": f"k{i}", "response": r}).encode() + b"\n"
        for i, r in enumerate(responses)
    )
    ledger = BatchLedger(use_msgspec=use_msgspec)
    by_definition: list[bytes] = []
    definition = ledger.line

    def spy(raw: bytes) -> None:
        by_definition.append(raw)
        definition(raw)

    ledger.line = spy  # type: ignore[method-assign]
    ledger.feed(data)
    ledger.finish()
    assert ledger.rows.as_dict() == reference(data)["rows"]
    assert band_details(ledger) == reference(data)["details"]
    assert ledger.rows.blocked == sum(_blocked(r) for r in responses)
    if use_msgspec:
        assert by_definition == []  # every line read by the structs


def test_msgspec_is_what_the_archiver_runs() -> None:
    """msgspec is in the archiver's requirements and the development environment: a ledger
    reads with it by default (the stdlib way is the fallback, tested above), and its structs
    name the six counts the ledger sums, in order."""
    from opstate.outcomes.ledger_rows import USAGE_GETTERS

    assert ledger_module.HAVE_MSGSPEC
    assert BatchLedger().use_msgspec
    assert tuple(key for key, _ in USAGE_GETTERS) == USAGE_FIELDS


@pytest.mark.parametrize("use_msgspec", [True, False], ids=["msgspec", "stdlib"])
def test_a_line_too_deep_for_json_is_unreadable_not_a_crash(use_msgspec: bool) -> None:
    deep = b'{"response": {}, "x": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    ledger = BatchLedger(use_msgspec=use_msgspec)
    ledger.feed(deep + b"\n" + b'{"response": {}}\n')
    ledger.finish()
    # {"response": {}} has no candidates: blocked, and succeeded
    assert ledger.rows.as_dict() == {
        "total": 2,
        "succeeded": 1,
        "blocked": 1,
        "failed": 0,
        "unreadable": 1,
    }


def capped_reference(data: bytes, max_line_bytes: int) -> dict[str, Any]:
    """Counts by the definition with a line cap: a line longer than ``max_line_bytes`` (without
    its newline, whatever it holds) is one unreadable row; the others as ``reference``."""
    kept: list[bytes] = []
    long_lines = 0
    for raw in data.split(b"\n"):
        if len(raw) > max_line_bytes:
            long_lines += 1
        else:
            kept.append(raw)
    out = reference(b"\n".join(kept))
    out["rows"]["total"] += long_lines
    out["rows"]["unreadable"] += long_lines
    return out


@settings(max_examples=500, deadline=None)
@given(
    lines,
    st.lists(st.integers(min_value=0), max_size=12),
    st.booleans(),
    st.integers(min_value=1, max_value=48),
)
@example([b"x" * 10, b'{"response": {}}', b" " * 30, b"y" * 100], [3, 5, 60], False, 16)
@pytest.mark.parametrize("use_msgspec", [True, False], ids=["msgspec", "stdlib"])
def test_a_line_past_the_cap_is_one_unreadable_row_however_it_is_cut(
    use_msgspec: bool, rows: list[bytes], cuts: list[int], trailing: bool, cap: int
) -> None:
    data = b"\n".join(rows) + (b"\n" if trailing else b"")
    ledger = BatchLedger(use_msgspec=use_msgspec, max_line_bytes=cap)
    for piece in chunked(data, cuts):
        ledger.feed(piece)
        assert len(ledger._rest) <= cap  # never more than the cap held between chunks
    ledger.finish()
    expected = capped_reference(data, cap)
    assert ledger.rows.as_dict() == expected["rows"]
    assert ledger.errors == expected["errors"]
    assert ledger.usage == expected["usage"]
    assert (ledger.size, ledger.sha256) == (len(data), hashlib.sha256(data).hexdigest())


@pytest.mark.parametrize("use_msgspec", [True, False], ids=["msgspec", "stdlib"])
def test_a_line_without_a_newline_is_read_past_in_bounded_memory(use_msgspec: bool) -> None:
    import tracemalloc

    mib = 1024 * 1024
    ledger = BatchLedger(use_msgspec=use_msgspec, max_line_bytes=mib)
    chunk = b"z" * mib
    tracemalloc.start()
    try:
        for _ in range(64):  # 64 MiB without a newline, in the SDK's 1 MiB chunks
            ledger.count(chunk)
        ledger.count(b'\n{"status": {"code": 8}}\n{"response": {}}')
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    ledger.finish()
    assert peak < 4 * mib, f"peak {peak / mib:.1f} MiB"
    assert ledger.rows.as_dict() == {
        "total": 3,
        "succeeded": 1,
        "blocked": 1,
        "failed": 1,
        "unreadable": 1,
    }
    assert ledger.errors == {"8": 1}


def test_codes_are_cut_and_counted_apart_only_up_to_a_bound() -> None:
    from opstate.outcomes.plan import MAX_CODE_CHARS, MAX_COUNTED_CODES, OTHER_CODES

    ledger = BatchLedger()
    long_code = "E" * 5000
    rows = [{"status": {"code": long_code}}, {"status": {"code": long_code + "x"}}]
    rows += [{"error": {"code": f"c{i}"}} for i in range(MAX_COUNTED_CODES + 50)]
    ledger.feed(b"".join(json.dumps(r).encode() + b"\n" for r in rows))
    ledger.finish()
    assert ledger.errors["E" * MAX_CODE_CHARS] == 2  # one code: the same first characters
    assert len(ledger.errors) == MAX_COUNTED_CODES + 1  # and "other"
    assert ledger.errors[OTHER_CODES] == 51
    assert sum(ledger.errors.values()) == ledger.rows.failed == len(rows)
