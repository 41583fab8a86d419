"""The trainer's settled sample ids: exact membership from a watermark per prompt."""

from asyncrl.consumers.settled import SettledIds, split_sample_id


def test_ids_are_settled_exactly_in_any_order_and_kept_as_a_watermark_per_prompt():
    ids = SettledIds.of(["a@0", "a@2", "b@1", "x", "a@1", "a@4", "c@01"])
    for sid in ("a@0", "a@1", "a@2", "a@4", "b@1", "x", "c@01"):
        assert sid in ids
    for sid in ("a@3", "a@5", "b@0", "b@2", "y", "c@1", "a", "a@"):
        assert sid not in ids
    assert ids.below == {"a": 3} and ids.ahead == {"a": {4}, "b": {1}}
    assert len(ids) == 7 and ids.entries() == 5  # a; a@4, b@1; x, c@01
    ids.add("a@3")  # the gap closes: one number for prompt a again
    assert ids.below["a"] == 5 and "a" not in ids.ahead
    again = SettledIds.from_state(ids.state())
    assert again.state() == ids.state() and "a@4" in again and "a@5" not in again


def test_only_a_plain_epoch_number_is_an_epoch():
    assert split_sample_id("add-3-4@12") == ("add-3-4", 12)
    assert split_sample_id("a@b@3") == ("a@b", 3)
    assert split_sample_id("a@-1") is None and split_sample_id("a@01") is None
    assert split_sample_id("a") is None
