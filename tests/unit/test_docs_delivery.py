"""What the docs promise about delivery matches the notifier: at least once, effectively once.

The notifier re-publishes changes when Lambda resumes a shard (a throttled entry is enough), so
no page may promise "exactly once"; every page that describes the announcement says "at least
once" and gives the de-duplication recipe (the idempotency key) next to it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["README.md", "docs/notifier.md", "docs/deploy.md", "docs/architecture.md", "template.yaml"]
OVERPROMISES = re.compile(
    r"exactly[\s-]+once|exactly one event|put once on the bus|announced once per change", re.I
)


@pytest.mark.parametrize("page", PAGES)
def test_no_page_promises_exactly_once_delivery(page: str) -> None:
    text = (ROOT / page).read_text(encoding="utf-8")
    assert not OVERPROMISES.findall(text), page


@pytest.mark.parametrize("page", ["README.md", "docs/notifier.md", "docs/deploy.md"])
def test_at_least_once_comes_with_the_deduplication_recipe(page: str) -> None:
    text = " ".join((ROOT / page).read_text(encoding="utf-8").split())
    assert re.search(
        r"at least once, with an idempotency key that makes it effectively once", text, re.I
    )
    # The recipe: keep processed keys, skip a seen one, keyed on idempotencyKey.
    assert "idempotencyKey" in text and "attribute_not_exists" in text
    assert re.search(r"skip an event whose key", text)
