"""What a newcomer reads first is what the code does (issue 25: the first ten minutes).

Each test holds one checkable fact of README.md / docs/ to the code it describes: the
idempotency key against the notifier's key builder, the deploy parameter table against the
template, the ``WebhookDeliveries`` outcomes against observability's list, the saved queries'
log groups against the template, the page's token and age wording, serve's store default, where
the ``opstate`` command is, and timings (none unmeasured; one marked place per page).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from opstate.config import DEFAULT_LOCAL_STORE, serve_store_url
from opstate.domain.model import OpRecord
from opstate.domain.states import State
from opstate.notify import idempotency_key
from opstate.observability import WEBHOOK_OUTCOMES
from tests.support.template import load_template

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
STATIC = ROOT / "layers" / "opstate" / "opstate" / "local" / "static"

# The one definition of the key, as every page quotes it; the older form only for records
# without a creation time, described in the notifier's key section.
KEY_FORM = "<name>@<created_ns>#<version>"
OLD_KEY_FORM = "<name>#<version>"
KEY_SECTION = "## The idempotency key"


def text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def flat(path: Path) -> str:
    return " ".join(text(path).split())


def section(page: str, heading: str) -> str:
    return page.split(heading, 1)[1].split("\n## ", 1)[0]


# --- 1. the idempotency key -----------------------------------------------------------------------


def fill(form: str, record: OpRecord) -> str:
    return (
        form.replace("<name>", record.name)
        .replace("<created_ns>", str(record.created_ns))
        .replace("<version>", str(record.version))
    )


def test_the_quoted_key_forms_are_what_the_notifier_builds() -> None:
    record = OpRecord("batches/abc123", State.SUCCEEDED, 6, 4, "webhook", created_ns=17672256)
    assert idempotency_key(record) == fill(KEY_FORM, record)
    legacy = OpRecord("batches/abc123", State.SUCCEEDED, 6, 4, "webhook", created_ns=0)
    assert idempotency_key(legacy) == fill(OLD_KEY_FORM, legacy)


@pytest.mark.parametrize(
    "page", [README, ROOT / "docs" / "notifier.md", ROOT / "docs" / "deploy.md"]
)
def test_every_page_that_subscribes_quotes_the_one_key(page: Path) -> None:
    assert f'"{KEY_FORM}"' in text(page), page.name


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: p.name)
def test_no_page_quotes_another_state_change_key(page: Path) -> None:
    body = text(page)
    for match in re.finditer(r'"<name>[^"\s]*#<version>"', body):
        quoted = match.group(0).strip('"')
        if quoted == KEY_FORM:
            continue
        # The older form is described once, where the key rule says when it is used.
        assert quoted == OLD_KEY_FORM, (page.name, quoted)
        assert page.name == "notifier.md", (page.name, quoted)
        assert match.start() > body.index(KEY_SECTION), "old key form outside the key section"


# --- 2. every template parameter is in docs/deploy.md's table -------------------------------------


def parameter_table() -> dict[str, str]:
    """``docs/deploy.md``'s parameter table: name -> documented default."""
    rows: dict[str, str] = {}
    body = text(ROOT / "docs" / "deploy.md")
    table = body.split("| parameter | default | meaning |", 1)[1].split("\n\n", 1)[0]
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        names = [n.strip().strip("`") for n in cells[0].split(" / ")]
        defaults = [d.strip().strip("`") for d in cells[1].split(" / ")]
        if len(defaults) != len(names):
            defaults = [cells[1].strip("`")] * len(names)
        rows.update(zip(names, defaults, strict=True))
    return rows


def test_every_template_parameter_is_in_the_deploy_table_with_its_default() -> None:
    parameters = load_template()["Parameters"]
    documented = parameter_table()
    assert sorted(set(parameters) - set(documented)) == [], "missing from docs/deploy.md"
    assert sorted(set(documented) - set(parameters)) == [], "not template parameters"
    for name, spec in parameters.items():
        default = str(spec.get("Default", ""))
        shown = documented[name]
        assert shown == default or (default == "" and shown == "empty"), (name, shown, default)


# --- 5. WebhookDeliveries outcomes ----------------------------------------------------------------


def test_api_md_lists_every_webhook_outcome() -> None:
    row = next(
        line
        for line in text(ROOT / "docs" / "api.md").splitlines()
        if "`WebhookDeliveries`" in line
    )
    meaning = row.strip().strip("|").split("|")[2]
    assert tuple(re.findall(r"`([a-z-]+)`", meaning)) == WEBHOOK_OUTCOMES
    assert "`quarantined`" in meaning


# --- 9. the saved queries' log groups -------------------------------------------------------------

LOG_GROUP_WORDS = {
    "WebhookLogGroup": "webhook",
    "ReconcileLogGroup": "reconciler",
    "NotifyLogGroup": "notifier",
}


def test_readme_names_the_log_groups_the_saved_queries_are_set_on() -> None:
    resources = load_template()["Resources"]
    groups: set[str] = set()
    for resource in resources.values():
        if resource["Type"] == "AWS::Logs::QueryDefinition":
            groups |= {ref["Ref"] for ref in resource["Properties"]["LogGroupNames"]}
    words = sorted(LOG_GROUP_WORDS[g] for g in groups)
    named = " and ".join(sorted(words, key=["webhook", "reconciler", "notifier"].index))
    readme = flat(README)
    assert f"They are preset on the {named} log groups" in readme
    assert "preset on the functions' log groups" not in readme


# --- 6 and 7. the page's token and age wording ----------------------------------------------------


def test_the_page_never_says_the_token_was_printed() -> None:
    page = text(STATIC / "index.html") + text(STATIC / "console.js")
    assert not re.search(r"token[^.<]*printed by", page, re.I), "serve prints no token"
    # It says where the token is (the token-help route), not that it was printed.
    assert "/ui/api/token-help" in text(STATIC / "console.js")


def test_the_age_is_described_as_what_the_page_computes() -> None:
    html, js = text(STATIC / "index.html"), text(STATIC / "console.js")
    local = flat(ROOT / "docs" / "local.md")
    assert "age.dataset.since = op.createdAt || op.updateTime" in js
    title = re.search(r'<abbr title="([^"]*)">Age</abbr>', html)
    assert title is not None
    assert "createdAt" in title.group(1) and "last server time" in title.group(1)
    for wording in (title.group(1), local):
        assert "first recorded" not in wording
    assert "since the record's `createdAt`" in local


# --- 8. serve's store default ---------------------------------------------------------------------


def test_serve_never_defaults_to_the_table_name_and_says_so() -> None:
    assert serve_store_url({"OPSTATE_TABLE_NAME": "ops"}) == DEFAULT_LOCAL_STORE
    assert serve_store_url({"OPSTATE_STORE": "memory://", "OPSTATE_TABLE_NAME": "t"}) == "memory://"
    store_row = next(
        line
        for line in text(ROOT / "docs" / "local.md").splitlines()
        if line.startswith("| `--store`")
    )
    assert "never `OPSTATE_TABLE_NAME`" in store_row
    from opstate.cli.app import build_parser

    parser = build_parser()
    serve = parser._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    assert "serve does not use OPSTATE_TABLE_NAME" in " ".join(serve.format_help().split())


# --- 11. where the opstate command is -------------------------------------------------------------


def test_readme_says_how_to_get_opstate_before_it_first_uses_it() -> None:
    body = text(README)
    first_use = min(m.start() for m in re.finditer(r"^(?:[A-Z_]+=\S+ )?opstate \w", body, re.M))
    assert body.index("source .venv/bin/activate") < first_use
    assert body.index(".venv/bin/opstate") < first_use
    operate = section(body, "## Operate")
    assert "source .venv/bin/activate" in operate and ".venv/bin/opstate" in operate


def make_dry_run(target: str) -> str:
    """What ``make`` would run for ``target``, every prerequisite remade (``-n -B``)."""
    result = subprocess.run(
        ["make", "-n", "-B", target], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.replace("\\\n", " ")  # continuation lines joined


@pytest.mark.skipif(
    subprocess.run(["which", "make"], capture_output=True).returncode != 0, reason="no make"
)
def test_make_run_says_what_it_installs_and_where_opstate_is() -> None:
    lines = make_dry_run("run").splitlines()
    said = next(i for i, line in enumerate(lines) if "installing .venv" in line)
    installs = [i for i, line in enumerate(lines) if "pip install" in line]
    assert installs and said < installs[0], "one line says what happens before pip starts"
    project = next(line for line in lines if "pip install" in line and "-e '.[dev]'" in line)
    assert "--quiet" not in project, "the install shows its own progress"
    hint = next(i for i, line in enumerate(lines) if "source .venv/bin/activate" in line)
    serve = next(i for i, line in enumerate(lines) if line.strip().endswith("opstate serve"))
    assert hint < serve and ".venv/bin/opstate" in lines[hint]


# --- 4. timings: none unmeasured, one marked place per page ---------------------------------------

TIMING_PAGES = [README, *DOCS, ROOT / "benchmarks" / "README.md"]
UNMEASURED = re.compile(
    r"\b(?:under|about|around|roughly|~) ?(?:a|one|\d+(?:[.,]\d+)?) (?:minute|minutes|min)\b"
    r"|\b\d+m\d+s\b",
    re.I,
)


@pytest.mark.parametrize("page", TIMING_PAGES, ids=lambda p: p.name)
def test_no_unmeasured_run_time_and_at_most_one_marked_timings_line(page: Path) -> None:
    body = text(page)
    assert UNMEASURED.findall(body) == [], page.name
    assert body.count("<!-- timings:") <= 1, page.name


def test_the_pages_with_timings_leave_them_to_a_measured_line() -> None:
    for page in (README, ROOT / "docs" / "deploy.md", ROOT / "docs" / "bench.md"):
        body = flat(page)
        assert "<!-- timings:" in body, page.name
        marked = body.split("<!-- timings:", 1)[1]
        assert "**Timings**" in marked.split("-->", 1)[1][:40], page.name
    assert "19\u201322 s" not in text(ROOT / "docs" / "deploy.md")
    assert "under a minute" not in text(ROOT / "docs" / "bench.md")
