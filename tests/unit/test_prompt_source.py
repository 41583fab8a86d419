"""The prompt source's commit bookkeeping, without a broker."""


def test_prompts_taken_out_of_order_never_commit_past_a_buffered_one():
    """take_where may hand out a later prompt first; the commit must not pass earlier ones
    still buffered (they would be lost in a crash)."""
    from asyncrl.kafka import Record
    from asyncrl.producers.prompt_source import PromptSource
    from asyncrl.schemas.prompt import PromptRecord

    committed: list = []
    source = PromptSource.__new__(PromptSource)  # no broker: only the bookkeeping
    source.topic, source.owned = "t.prompts", {0}
    source._open, source._next_commit = {}, {}
    source.reader = type("R", (), {"commit": lambda self, o, asynchronous: committed.append(o)})()
    source._buffer = [
        Record("t.prompts", 0, off, f"p{off}", 0, {}, PromptRecord(f"p{off}", "", "", 0))
        for off in range(3)
    ]
    late = source.take_where(lambda r: r.offset == 2)
    source.done(late)
    assert committed[-1] == {("t.prompts", 0): 0}  # 0 and 1 still buffered
    first = source.take_where(lambda r: True)
    source.done(first)
    assert committed[-1] == {("t.prompts", 0): 1}
