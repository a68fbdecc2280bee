"""Attempt ids and fencing of the retry RFC: unique ids, and the DynamoDB condition that refuses
a late write from a superseded attempt (the end-to-end case is in test_reclaim_retry_http)."""

from pipelines.retry import ATTEMPT_ID_ATTR, dynamodb_fence, new_attempt_id


def test_attempt_ids_are_unique():
    assert len({new_attempt_id() for _ in range(200)}) == 200


def test_attempt_ids_are_prefixed():
    assert new_attempt_id().startswith("att-")


def test_the_fence_names_the_attempt_attribute():
    assert dynamodb_fence("att-1")["names"] == {"#fence": ATTEMPT_ID_ATTR}


def test_the_fence_accepts_only_the_attempt_it_was_made_for():
    fence = dynamodb_fence("att-1")
    assert (fence["condition"], fence["values"]) == ("#fence = :fence", {":fence": {"S": "att-1"}})


def test_the_fence_of_a_record_without_attempts_requires_none():
    fence = dynamodb_fence(None, "attempt")
    assert (fence["condition"], fence["names"], fence["values"]) == (
        "attribute_not_exists(#fence)",
        {"#fence": "attempt"},
        {},
    )
