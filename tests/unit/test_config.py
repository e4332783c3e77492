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


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("OPSTATE_OPEN_INDEX_SHARDS", "four"),
        ("OPSTATE_OPEN_INDEX_SHARDS", "0"),
        ("OPSTATE_RETENTION_DAYS", "1.5"),
        ("OPSTATE_RETENTION_DAYS", "-1"),
        ("OPSTATE_INGEST_MAX_ATTEMPTS", "many"),
        ("OPSTATE_INGEST_MAX_ATTEMPTS", "0"),
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
