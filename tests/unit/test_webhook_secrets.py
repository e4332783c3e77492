"""The one rule for stored webhook secrets (opstate.webhook_secrets): parsing, writing, locked
local updates and version-checked Secrets Manager updates."""

from __future__ import annotations

import base64
import json
import os
import stat
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from opstate.webhook_secrets import (
    MIN_KEY_BYTES,
    ParsedSecrets,
    SecretConflictError,
    SecretFileReader,
    create_secret_file,
    file_lock,
    generate_secret,
    is_key,
    merge_new,
    parse_stored,
    read_secret_file,
    read_secrets_manager,
    render_json,
    render_text,
    revoked_by_rotation,
    rotation_change,
    secret_key,
    update_secret_file,
    update_secrets_manager,
    write_secret_file,
)
from tests.support.webhooks import OTHER_SECRET, ROTATED_SECRET, TEST_SECRET


def key_of(raw: bytes) -> str:
    return "whsec_" + base64.b64encode(raw).decode()


K1, K2, K3 = TEST_SECRET, ROTATED_SECRET, OTHER_SECRET
K4 = key_of(b"4" * 32)


# --- the rule ------------------------------------------------------------------------------------


def test_gemini_shaped_secrets_are_keys() -> None:
    for secret in (K1, K2, K3, generate_secret()):
        assert secret_key(secret) is not None
        assert len(secret_key(secret) or b"") == 32


@pytest.mark.parametrize(
    "entry",
    [
        "placeholder",  # decoded by the old code as an 8-byte key
        "CHANGEME",
        "current",
        "secret",
        "whsec_ab",  # one byte
        key_of(b"z" * (MIN_KEY_BYTES - 1)),
        K1.removeprefix("whsec_"),  # bare base64
        "whsec_" + K1.removeprefix("whsec_").replace("Z", "!", 1),
        "whsec_" + "A" * 33,  # base64 with a bad length
        "WHSEC_" + K1.removeprefix("whsec_"),
        "",
    ],
)
def test_everything_else_is_not_a_key(entry: str) -> None:
    assert secret_key(entry) is None
    assert not is_key(entry)


def test_the_shortest_key_is_24_bytes() -> None:
    assert is_key(key_of(b"k" * MIN_KEY_BYTES))
    assert MIN_KEY_BYTES == 24


@pytest.mark.parametrize(
    ("value", "keys", "ignored"),
    [
        (K1, (K1,), ()),
        (f"  {K1}\n", (K1,), ()),
        (json.dumps([K1, K2]), (K1, K2), ()),
        (f"{K1} {K2}", (K1, K2), ()),
        (f"{K1}\n{K2}\n", (K1, K2), ()),
        (K1.encode(), (K1,), ()),
        ([K1, K2], (K1, K2), ()),
        # The reproductions of issue 12: none of these is a key any more.
        ('["placeholder"]', (), ("entry 1",)),
        (json.dumps([K1, "placeholder"]), (K1,), ("entry 2",)),
        ("CHANGEME", (), ("line 1",)),
        (f"# current secret\n{K1}\n", (K1,), ()),
        (f"# rotated 2026-05-10, old one below\n{K1}\n{K2}\n", (K1, K2), ()),
        (f"   # indented comment\n{K1}\n", (K1,), ()),
        (f"{K1}\nab\n", (K1,), ("line 2",)),
        # Duplicates collapse, order (newest first) is kept.
        (f"{K2}\n{K1}\n{K2}\n", (K2, K1), ()),
        # Lists: non-strings and non-keys are ignored by position; comments skipped.
        (json.dumps([1, K1, None, "#note", "", "x"]), (K1,), ("entry 1", "entry 3", "entry 6")),
        # A JSON object or broken JSON is text: its entries are not keys.
        ('{"a": 1}', (), ("line 1, entry 1", "line 1, entry 2")),
        ("[not json", (), ("line 1, entry 1", "line 1, entry 2")),
        ("", (), ()),
        ("[]", (), ()),
    ],
)
def test_parse_stored(value: Any, keys: tuple[str, ...], ignored: tuple[str, ...]) -> None:
    assert parse_stored(value) == ParsedSecrets(keys, ignored)


def test_warnings_name_the_position_never_the_value() -> None:
    parsed = parse_stored(f"{K1}\nplaceholder\n# note\nCHANGEME {K2}\n")
    assert parsed.keys == (K1, K2)
    warnings = parsed.warnings("the local file x")
    assert warnings == [
        "the local file x: line 2 is not a webhook secret ('whsec_' + base64 of at least 24 "
        "bytes); ignored",
        "the local file x: line 4, entry 1 is not a webhook secret ('whsec_' + base64 of at "
        "least 24 bytes); ignored",
    ]
    assert not any("placeholder" in w or "CHANGEME" in w for w in warnings)


def test_stored_bytes_that_are_not_utf8() -> None:
    # A comment in another encoding stays a comment: the keys still count.
    assert parse_stored(b"# rotated by Jos\xe9\n" + K1.encode() + b"\n").keys == (K1,)
    # A stray byte inside an entry makes that entry unusable; it never turns into another key
    # (dropping the byte would leave exactly K1).
    raw = K1.encode()
    mangled = raw[:12] + b"\xff" + raw[12:]
    assert parse_stored(mangled) == ParsedSecrets((), ("line 1",))
    assert parse_stored(mangled + b"\n" + K2.encode()) == ParsedSecrets((K2,), ("line 1",))
    # Nothing but undecodable bytes: no key (the webhook answers 503).
    assert parse_stored(b"\xff\xfe\xfd").keys == ()


# --- writing: keys only --------------------------------------------------------------------------


def test_writers_refuse_anything_but_keys(tmp_path: Path) -> None:
    path = tmp_path / "webhook-secret"
    for bad in (["# comment"], [K1, "current"], [K1, "placeholder"], ["whsec_ab"]):
        with pytest.raises(ValueError, match="not a key") as info:
            write_secret_file(path, bad)
        assert "placeholder" not in str(info.value)
        with pytest.raises(ValueError):
            render_json(bad)
    assert not path.exists()
    assert render_json([K1, K2]) == json.dumps([K1, K2])
    assert render_text([K1, K2]) == f"{K1}\n{K2}\n"


def test_write_secret_file_is_private_and_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "dir" / "webhook-secret"
    write_secret_file(path, [K1, K2])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_secret_file(path).keys == (K1, K2)
    assert sorted(p.name for p in path.parent.iterdir()) == ["webhook-secret"]


def test_create_secret_file_generates_once(tmp_path: Path) -> None:
    path = tmp_path / "webhook-secret"
    assert create_secret_file(path) is True
    first = read_secret_file(path).keys
    assert len(first) == 1 and is_key(first[0])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert create_secret_file(path) is False
    assert read_secret_file(path).keys == first


def test_merge_new_puts_the_new_key_first_and_bounds_the_list() -> None:
    assert merge_new(K1, [K2, K1, K3]) == [K1, K2, K3]
    many = [key_of(bytes([i]) * 32) for i in range(40)]
    assert merge_new(K1, many, limit=8) == [K1, *many[:7]]


# --- local file: locked read-merge-write ---------------------------------------------------------


def test_update_secret_file_rewrites_a_commented_file_with_keys_only(tmp_path: Path) -> None:
    path = tmp_path / "webhook-secret"
    path.write_text(f"# current secret\n{K1}\n# rotated 2026-05-10, old one below\n{K2}\n")
    path.chmod(0o600)  # a secret file follows opstate.private_files' rule
    written = update_secret_file(path, rotation_change(K3))
    assert written == [K3, K1, K2]
    assert path.read_text() == f"{K3}\n{K1}\n{K2}\n"  # no comment word became a secret


def test_update_secret_file_of_a_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "webhook-secret"
    assert update_secret_file(path, rotation_change(K1)) == [K1]
    assert read_secret_file(path).keys == (K1,)


def test_overlapping_local_updates_lose_nothing(tmp_path: Path) -> None:
    """Two rotations at once: the second waits for the first's lock, then re-reads."""
    path = tmp_path / "webhook-secret"
    write_secret_file(path, [K1])
    inside = threading.Event()
    release = threading.Event()

    def slow_change(current: Sequence[str]) -> list[str]:
        inside.set()
        assert release.wait(10)
        return merge_new(K2, current)

    first = threading.Thread(target=update_secret_file, args=(path, slow_change))
    first.start()
    assert inside.wait(10)
    second_done = threading.Event()

    def second() -> None:
        update_secret_file(path, rotation_change(K3))
        second_done.set()

    other = threading.Thread(target=second)
    other.start()
    assert not second_done.wait(0.2)  # blocked on the lock while the first one works
    release.set()
    first.join(10)
    other.join(10)
    assert set(read_secret_file(path).keys) == {K1, K2, K3}
    assert read_secret_file(path).keys[0] == K3  # the later rotation's key is newest


def test_the_lock_is_a_private_sidecar(tmp_path: Path) -> None:
    path = tmp_path / "webhook-secret"
    with file_lock(path):
        lock = tmp_path / ".webhook-secret.lock"
        assert lock.exists()
        assert stat.S_IMODE(lock.stat().st_mode) == 0o600
    assert not path.exists()


def test_secret_file_reader_follows_replacements(tmp_path: Path) -> None:
    path = tmp_path / "webhook-secret"
    write_secret_file(path, [K1])
    reader = SecretFileReader(path)
    assert parse_stored(reader()).keys == (K1,)
    write_secret_file(path, [K2, K1])
    assert parse_stored(reader()).keys == (K2, K1)
    os.unlink(path)
    assert parse_stored(reader()).keys == (K2, K1)  # last content read stays in use


# --- rotation: what to prune ---------------------------------------------------------------------


def truncated(secret: str) -> str:
    return secret[:10] + "..." + secret[-4:]


def test_revoked_by_rotation_drops_only_what_this_webhook_stopped_listing() -> None:
    stored = [K2, K1, K3, K4]  # K3: another project's; K4: added by hand
    # Before: this webhook listed K1 and K2; after an immediate revocation only the new one.
    dropped = revoked_by_rotation(
        [K4, *stored], K4, [truncated(K1), truncated(K2)], [truncated(K4)]
    )
    assert dropped == {K1, K2}
    # 24 h revocation: the previous key is still listed after the rotation - kept.
    assert revoked_by_rotation(stored, K4, [truncated(K2)], [truncated(K4), truncated(K2)]) == set()
    # An answer that does not show the new key cannot be trusted: nothing dropped.
    assert revoked_by_rotation(stored, K4, [truncated(K1)], [truncated(K2)]) == set()


# --- Secrets Manager: version-checked read-merge-write --------------------------------------------


def _secret(client: Any, name: str, value: str | None) -> str:
    if value is None:
        arn: str = client.create_secret(Name=name)["ARN"]
    else:
        arn = client.create_secret(Name=name, SecretString=value)["ARN"]
    return arn


def test_read_secrets_manager_without_a_value_yet(aws_secrets: Any) -> None:
    arn = _secret(aws_secrets, "opstate/empty", None)
    assert read_secrets_manager(aws_secrets, arn) == (ParsedSecrets(()), None)


def test_update_secrets_manager_merges_and_writes_keys_only(aws_secrets: Any) -> None:
    arn = _secret(aws_secrets, "opstate/merge", json.dumps([K1, "placeholder"]))
    assert update_secrets_manager(aws_secrets, arn, rotation_change(K2)) == [K2, K1]
    value = aws_secrets.get_secret_value(SecretId=arn)["SecretString"]
    assert json.loads(value) == [K2, K1]


class Interleaving:
    """A Secrets Manager client that lets another writer run once, at a chosen call."""

    def __init__(self, client: Any, at: str, writer: Any) -> None:
        self._client = client
        self._at = at
        self._writer = writer
        self.fired = False

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if name != self._at or self.fired:
            return attr

        def call(**kwargs: Any) -> Any:
            self.fired = True
            self._writer()
            return attr(**kwargs)

        return call


def test_concurrent_rotation_between_read_and_write_is_merged(aws_secrets: Any) -> None:
    """Issue 18 item 1: the other rotation lands after our read, before our write."""
    arn = _secret(aws_secrets, "opstate/race-check", json.dumps([K1]))

    def other_rotation() -> None:
        update_secrets_manager(aws_secrets, arn, rotation_change(K3))

    client = Interleaving(aws_secrets, "describe_secret", other_rotation)
    written = update_secrets_manager(client, arn, rotation_change(K2))
    assert client.fired
    stored = json.loads(aws_secrets.get_secret_value(SecretId=arn)["SecretString"])
    assert stored == written
    assert set(stored) == {K1, K2, K3}


def test_concurrent_write_just_before_our_put_is_detected_and_merged(aws_secrets: Any) -> None:
    """The other writer slips in after our version check, right before our put."""
    arn = _secret(aws_secrets, "opstate/race-put", json.dumps([K1]))

    def other_write() -> None:
        aws_secrets.put_secret_value(SecretId=arn, SecretString=json.dumps([K3, K1]))

    client = Interleaving(aws_secrets, "put_secret_value", other_write)
    update_secrets_manager(client, arn, rotation_change(K2))
    assert client.fired
    stored = json.loads(aws_secrets.get_secret_value(SecretId=arn)["SecretString"])
    assert set(stored) == {K1, K2, K3}
    assert stored[0] == K2


def test_a_secret_that_never_stops_changing_is_a_clear_error(aws_secrets: Any) -> None:
    arn = _secret(aws_secrets, "opstate/race-forever", json.dumps([K1]))

    class Busy:
        def __getattr__(self, name: str) -> Any:
            attr = getattr(aws_secrets, name)
            if name != "describe_secret":
                return attr

            def call(**kwargs: Any) -> Any:
                aws_secrets.put_secret_value(SecretId=arn, SecretString=json.dumps([K1]))
                return attr(**kwargs)

            return call

    with pytest.raises(SecretConflictError, match="kept changing"):
        update_secrets_manager(Busy(), arn, rotation_change(K2), attempts=3)
    assert K2 not in json.loads(aws_secrets.get_secret_value(SecretId=arn)["SecretString"])


def test_rotation_change_decides_the_drop_on_the_keys_at_write_time() -> None:
    change = rotation_change(K4, listed_before=[truncated(K1)], listed_after=[truncated(K4)])
    # K3 was added by someone else between our read and our write: kept; K1 revoked: dropped.
    assert change([K1, K3]) == [K4, K3]
    assert change([K1]) == [K4]
    assert rotation_change(K4)([K1, K2]) == [K4, K1, K2]


def test_an_update_that_changes_nothing_writes_no_version(aws_secrets: Any) -> None:
    arn = _secret(aws_secrets, "opstate/no-op", json.dumps([K1, K2]))
    before = aws_secrets.describe_secret(SecretId=arn)["VersionIdsToStages"]
    assert update_secrets_manager(aws_secrets, arn, lambda keys: list(keys)) == [K1, K2]
    assert aws_secrets.describe_secret(SecretId=arn)["VersionIdsToStages"] == before
