"""docs/google-cloud.md states checkable facts: its configuration table and defaults are the
code's, and every template parameter and output it names exists."""

from __future__ import annotations

import re
from pathlib import Path

from opstate.config import DEFAULT_PUBSUB_JWKS_URL, PUBSUB_ISSUERS, Settings
from tests.support.template import load_template

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "google-cloud.md").read_text(encoding="utf-8")


def test_the_defaults_on_the_page_are_the_code_s() -> None:
    assert "| `OPSTATE_GOOGLE_CLOUD_MAX_RPS` | 10 |" in PAGE
    assert Settings().google_cloud_max_rps == 10.0
    assert load_template()["Parameters"]["GoogleCloudMaxRps"]["Default"] == 10
    assert DEFAULT_PUBSUB_JWKS_URL in PAGE
    assert all(f"`{issuer}`" in PAGE for issuer in PUBSUB_ISSUERS)


def test_every_variable_on_the_page_is_read_by_config() -> None:
    source = "\n".join(
        path.read_text(encoding="utf-8")
        for path in sorted((ROOT / "layers/opstate/opstate/config").glob("*.py"))
    )
    named = set(re.findall(r"`((?:OPSTATE|GOOGLE)_[A-Z_]+)`", PAGE))
    assert "OPSTATE_GOOGLE_CLOUD_SCOPES" in named
    read_by_sdk = {"GOOGLE_VERTEX_BASE_URL"}
    missing = {v for v in named - read_by_sdk if f'"{v}"' not in source}
    assert not missing, missing


def test_the_parameters_and_outputs_the_page_names_exist() -> None:
    template = load_template()
    for parameter in ("GoogleCloudScopes", "GoogleCloudMaxRps", "PubSubAudience"):
        assert parameter in template["Parameters"] and f"`{parameter}`" in PAGE
    assert "PubSubServiceAccountEmail" in template["Parameters"]
    for output in ("GoogleCredentialsSecretArn", "ReconcileRoleArn", "PubSubPushUrl"):
        assert output in template["Outputs"] and output in PAGE


def test_the_template_takes_the_scopes_config_takes() -> None:
    # The stack refuses at deploy time what the reconciler would refuse at its start, and
    # takes what it takes (a location in capitals aside: the parameter asks for lowercase).
    pattern = re.compile(load_template()["Parameters"]["GoogleCloudScopes"]["AllowedPattern"])
    for good in ("", "my-project/us-central1", "p1/us-central1 123/europe-west4"):
        assert pattern.fullmatch(good), good
        Settings.from_env({"OPSTATE_GOOGLE_CLOUD_SCOPES": good})
    for bad in ("my_project/us-central1", "p1/us.central1", "P1/us-central1", "p1"):
        assert not pattern.fullmatch(bad), bad
