"""A job's cost is the sum of its parts' lineage costs, or unknown naming the part (issue 46:
"Cost and maxCostUSD are the job's")."""

from __future__ import annotations

from opstate.domain.costs import final_cost_view, job_cost


def part(usd: str | None, retries: str | None = "0", reason: str | None = None) -> dict:
    doc = {
        "usd": usd,
        "retries_usd": retries,
        "model": "gemini-2.5-flash",
        "prices": "genai-prices 0.2.5",
        "batch_discount": {"by": "genai-prices", "factor": None},
    }
    if reason:
        doc["reason"] = reason
    return doc


def test_a_job_costs_the_sum_of_its_parts() -> None:
    cost = job_cost([("batches/a", part("0.25", "0.05")), ("batches/b", part("0.5"))])
    assert cost["usd"] == "0.75" and cost["retries_usd"] == "0.05"
    assert cost["model"] == "gemini-2.5-flash" and "reason" not in cost
    assert final_cost_view(cost)["usd"] == 0.75


def test_one_unknown_part_makes_the_job_unknown_and_says_which() -> None:
    cost = job_cost(
        [
            ("batches/a", part("0.25")),
            ("batches/b", part(None, None, reason="no row reports its token usage")),
            ("batches/c", None),
        ]
    )
    assert cost["usd"] is None and cost["retries_usd"] is None
    assert cost["reason"].startswith("the cost of part batches/b is unknown: no row reports")
    view = final_cost_view(cost)
    assert view["usd"] is None and "earlier release" not in view["reason"]


def test_a_job_with_no_created_part_cost_nothing() -> None:
    assert job_cost([])["usd"] == "0"
