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


def test_a_commit_the_group_refuses_on_leaving_does_not_stop_the_leave(caplog):
    """A worker that joined mid-run ended as the group rebalanced (another worker's session
    expiring): the commit on leaving failed with ILLEGAL_GENERATION, the worker ended in a
    traceback and its process stayed up, its consumer never released. As at a revocation,
    the partitions' next owner re-reads the log: nothing is lost by the failed commit."""
    from confluent_kafka import KafkaError, KafkaException

    from asyncrl.producers.prompt_source import PromptSource

    closed: list = []

    class Group:
        def quiet(self) -> bool:
            return True

    class Reader:
        group = Group()

        def commit(self, offsets, asynchronous):
            raise KafkaException(KafkaError(KafkaError.ILLEGAL_GENERATION))

        def close(self, leave_group=True):
            closed.append(leave_group)

    source = PromptSource.__new__(PromptSource)  # no broker: only the leaving
    source.topic, source.owned, source.reader = "t.prompts", {0}, Reader()
    source._open, source._next_commit, source._buffer = {}, {0: 5}, []
    source.join_wait_s = 1.0
    source.close()
    assert closed == [False]  # left by session expiry, as ever
    assert "on leaving failed" in caplog.text
