"""Settings from the environment, and stores from URLs."""

from __future__ import annotations

from pathlib import Path

import pytest

from opstate.config import DEFAULT_LOCAL_STORE, ConfigError, Settings
from opstate.store import MemoryStore, Store, store_from_url
from opstate.store.dynamodb import DynamoDBStore
from opstate.store.sqlite import SQLiteStore


def test_defaults() -> None:
    settings = Settings.from_env({})
    assert settings.store_url == DEFAULT_LOCAL_STORE == "sqlite:///.opstate/ops.db"
    assert settings.open_index_shards == 4
    assert settings.retention_days == 90
    assert settings.ingest_max_attempts == 8


def test_table_name_selects_dynamodb() -> None:
    settings = Settings.from_env({"OPSTATE_TABLE_NAME": "ops-prod"})
    assert settings.store_url == "dynamodb://ops-prod"


def test_explicit_store_wins_over_table_name() -> None:
    env = {"OPSTATE_TABLE_NAME": "ops-prod", "OPSTATE_STORE": "sqlite:///x.db"}
    assert Settings.from_env(env).store_url == "sqlite:///x.db"


def test_blank_values_mean_default() -> None:
    settings = Settings.from_env({"OPSTATE_TABLE_NAME": "  ", "OPSTATE_RETENTION_DAYS": ""})
    assert settings.store_url == DEFAULT_LOCAL_STORE and settings.retention_days == 90


def test_store_numbers_are_read() -> None:
    settings = Settings.from_env(
        {
            "OPSTATE_OPEN_INDEX_SHARDS": "16",
            "OPSTATE_RETENTION_DAYS": "7",
            "OPSTATE_INGEST_MAX_ATTEMPTS": "3",
        }
    )
    assert (settings.open_index_shards, settings.retention_days) == (16, 7)
    assert settings.ingest_max_attempts == 3


def test_the_results_line_cap_is_read_within_its_bounds() -> None:
    assert Settings.from_env({}).results_max_line_mib == 32
    for value in (1, 256):
        read = Settings.from_env({"OPSTATE_RESULTS_MAX_LINE_MIB": str(value)})
        assert read.results_max_line_mib == value


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("OPSTATE_OPEN_INDEX_SHARDS", "four"),
        ("OPSTATE_OPEN_INDEX_SHARDS", "0"),
        ("OPSTATE_RETENTION_DAYS", "1.5"),
        ("OPSTATE_RETENTION_DAYS", "-1"),
        ("OPSTATE_INGEST_MAX_ATTEMPTS", "many"),
        ("OPSTATE_INGEST_MAX_ATTEMPTS", "0"),
        ("OPSTATE_RESULTS_MAX_LINE_MIB", "0"),
        ("OPSTATE_RESULTS_MAX_LINE_MIB", "257"),
        ("OPSTATE_RESULTS_MAX_LINE_MIB", "1.5"),
    ],
)
def test_bad_numbers_raise_config_error_naming_the_variable(key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=key):
        Settings.from_env({key: value})


# -- store_from_url ----------------------------------------------------------------------------


def test_memory_url() -> None:
    store = store_from_url("memory://")
    assert isinstance(store, MemoryStore) and isinstance(store, Store)


def test_sqlite_relative_url_creates_parents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = store_from_url("sqlite:///.opstate/deep/ops.db")
    try:
        assert isinstance(store, SQLiteStore) and isinstance(store, Store)
        assert store.path == Path(".opstate/deep/ops.db")
        assert (tmp_path / ".opstate" / "deep" / "ops.db").is_file()
    finally:
        store.close()


def test_sqlite_absolute_url(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b.db"
    store = store_from_url(f"sqlite:///{target}")  # "sqlite:///" + "/abs/..." = four slashes
    try:
        assert isinstance(store, SQLiteStore)
        assert store.path == target and target.is_file()
    finally:
        store.close()


def test_sqlite_url_takes_retention_from_settings(tmp_path: Path) -> None:
    settings = Settings.from_env({"OPSTATE_RETENTION_DAYS": "3"})
    store = store_from_url(f"sqlite:///{tmp_path}/r.db", settings)
    try:
        assert isinstance(store, SQLiteStore) and store.retention_days == 3
    finally:
        store.close()


def test_dynamodb_url_takes_shards_and_retention_from_settings() -> None:
    settings = Settings.from_env({"OPSTATE_OPEN_INDEX_SHARDS": "8", "OPSTATE_RETENTION_DAYS": "30"})
    store = store_from_url("dynamodb://ops-table", settings)
    assert isinstance(store, DynamoDBStore) and isinstance(store, Store)
    assert (store.table_name, store.shards, store.retention_days) == ("ops-table", 8, 30)
    defaults = store_from_url("dynamodb://other")
    assert isinstance(defaults, DynamoDBStore)
    assert (defaults.shards, defaults.retention_days) == (4, 90)


def test_dynamodb_store_honours_the_endpoint_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", "http://127.0.0.1:4566")
    store = store_from_url("dynamodb://ops")
    assert isinstance(store, DynamoDBStore)
    assert store.client.meta.endpoint_url == "http://127.0.0.1:4566"
    config = store.client.meta.config
    assert config.retries["mode"] == "standard"
    assert config.connect_timeout and config.read_timeout


@pytest.mark.parametrize(
    "url",
    [
        "",
        "ops.db",
        "postgres://db/ops",
        "dynamodb://",
        "dynamodb://a/b",
        "sqlite://",
        "sqlite:///",
        "sqlite:///:memory:",
        "sqlite:///dir/",
        "memory://something",
        "file:///tmp/x.db",
    ],
)
def test_bad_urls_raise_value_error(url: str) -> None:
    with pytest.raises(ValueError, match="store URL"):
        store_from_url(url)


# -- durations: finite and in range ------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("OPSTATE_RECONCILE_SAFETY_MARGIN_SECONDS", "nan"),
        ("OPSTATE_RECONCILE_SAFETY_MARGIN_SECONDS", "NaN"),
        ("OPSTATE_RECONCILE_SAFETY_MARGIN_SECONDS", "inf"),
        ("OPSTATE_RECONCILE_SAFETY_MARGIN_SECONDS", "-inf"),
        ("OPSTATE_RECONCILE_SAFETY_MARGIN_SECONDS", "1e999"),
        ("OPSTATE_RECONCILE_SAFETY_MARGIN_SECONDS", "-1"),
        ("OPSTATE_RECONCILE_SAFETY_MARGIN_SECONDS", "901"),
        ("OPSTATE_RECONCILE_HTTP_TIMEOUT_SECONDS", "inf"),
        ("OPSTATE_RECONCILE_HTTP_TIMEOUT_SECONDS", "Infinity"),
        ("OPSTATE_RECONCILE_HTTP_TIMEOUT_SECONDS", "nan"),
        ("OPSTATE_RECONCILE_HTTP_TIMEOUT_SECONDS", "0"),
        ("OPSTATE_RECONCILE_HTTP_TIMEOUT_SECONDS", "1e9"),
        ("OPSTATE_RECONCILE_HTTP_TIMEOUT_SECONDS", "five"),
    ],
)
def test_bad_durations_raise_config_error_naming_the_variable(key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=key):
        Settings.from_env({key: value})


def test_durations_in_range_are_read() -> None:
    settings = Settings.from_env(
        {
            "OPSTATE_RECONCILE_SAFETY_MARGIN_SECONDS": "0",
            "OPSTATE_RECONCILE_HTTP_TIMEOUT_SECONDS": "2.5",
        }
    )
    assert (settings.reconcile_safety_margin_s, settings.reconcile_http_timeout_s) == (0.0, 2.5)
    top = Settings.from_env({"OPSTATE_RECONCILE_SAFETY_MARGIN_SECONDS": "900"})
    assert top.reconcile_safety_margin_s == 900.0


@pytest.mark.parametrize("function", ["webhook", "reconcile", "notify"])
def test_a_bad_setting_fails_the_lambda_init_naming_the_variable(
    function: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    from opstate.config import settings

    path = Path(__file__).resolve().parents[2] / "functions" / function / "app.py"
    spec = importlib.util.spec_from_file_location(f"{function}_init_under_test", path)
    assert spec is not None and spec.loader is not None
    monkeypatch.setenv("OPSTATE_RECONCILE_SAFETY_MARGIN_SECONDS", "nan")
    settings.cache_clear()
    try:
        with pytest.raises(ConfigError, match="OPSTATE_RECONCILE_SAFETY_MARGIN_SECONDS"):
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
    finally:
        settings.cache_clear()


# -- parts, secrets, the README ----------------------------------------------------------------

SECRET_ENV = {
    "OPSTATE_WEBHOOK_SECRETS": "whsec_c2VjcmV0LW9uZQ== whsec_c2VjcmV0LXR3bw==",
    "GEMINI_API_KEY": "AIza-not-a-real-key-0123456789",
    "OPSTATE_API_TOKEN": "t0k3n" * 8,
    "OPSTATE_RETRY_API_TOKEN": "r3try" * 8,
}


def test_repr_never_shows_a_secret_value() -> None:
    from opstate.config import PARTS

    settings = Settings.from_env(SECRET_ENV)
    assert settings.webhook_secrets and settings.gemini_api_key and settings.api_token
    assert settings.retry_api_token
    secrets = [*SECRET_ENV["OPSTATE_WEBHOOK_SECRETS"].split(), *list(SECRET_ENV.values())]
    shown = [repr(settings), str(settings), *(repr(part.from_env(SECRET_ENV)) for part in PARTS)]
    for text in shown:
        for secret in secrets:
            assert secret not in text
    assert "store_url=" in repr(settings)  # the rest is still shown


def test_each_part_reads_its_own_variables_and_settings_is_every_part() -> None:
    from opstate.config import PARTS, ReconcileSettings, StoreSettings

    env = {"OPSTATE_RETENTION_DAYS": "7", "OPSTATE_RECONCILE_WORKERS": "3"}
    assert StoreSettings.from_env(env) == StoreSettings(retention_days=7)
    assert ReconcileSettings.from_env(env) == ReconcileSettings(reconcile_workers=3)
    settings = Settings.from_env(env)
    assert settings == Settings(retention_days=7, reconcile_workers=3)
    assert all(isinstance(settings, part) for part in PARTS)


def test_an_unset_variable_keeps_the_field_default() -> None:
    # from_env({}) builds exactly the dataclass defaults: no second copy of a default to drift.
    from opstate.config import PARTS

    assert Settings.from_env({}) == Settings()
    for part in PARTS:
        assert part.from_env({}) == part()


def test_the_readme_lists_every_variable_read() -> None:
    import re

    root = Path(__file__).resolve().parents[2]
    package = root / "layers" / "opstate" / "opstate" / "config"
    source = "\n".join(path.read_text(encoding="utf-8") for path in sorted(package.glob("*.py")))
    variables = set(re.findall(r'"((?:OPSTATE|GEMINI|AWS_SAM)_[A-Z_]+)"', source))
    assert {"OPSTATE_STORE", "GEMINI_API_KEY", "OPSTATE_EVENT_BUS_NAME"} <= variables
    table = [line for line in (root / "README.md").read_text().splitlines() if line.startswith("|")]
    # "`OPSTATE_RECONCILE_LOST_AFTER_RUNS` / `_LOST_AFTER_HOURS`": a shorthand names a suffix.
    names = set(re.findall(r"`([A-Z_]+)`", " ".join(table)))
    missing = {
        v
        for v in variables
        if v not in names and not any(n.startswith("_") and v.endswith(n) for n in names)
    }
    assert not missing, f"README's configuration table lacks {sorted(missing)}"


@pytest.mark.parametrize(
    "raw",
    [
        "my_project/us-central1",  # '_' is no project id character
        "my.project/us-central1",
        "p1/us.central1",
        "p1/evil.example#",
        "p1",
        "/us-central1",
        "P1/us-central1",  # a project id is lowercase; Google does not fold it
    ],
)
def test_a_cloud_scope_outside_googles_alphabet_is_refused(raw: str) -> None:
    with pytest.raises(ConfigError, match="OPSTATE_GOOGLE_CLOUD_SCOPES"):
        Settings.from_env({"OPSTATE_GOOGLE_CLOUD_SCOPES": raw})


def test_a_cloud_scope_location_in_any_case_is_one_scope() -> None:
    s = Settings.from_env({"OPSTATE_GOOGLE_CLOUD_SCOPES": "p1/US-CENTRAL1 p1/us-central1 123/eu"})
    assert s.google_cloud_scopes == (("p1", "us-central1"), ("123", "eu"))
