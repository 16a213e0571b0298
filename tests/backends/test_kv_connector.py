"""The engine's KV-connector seam: a sequence waits for loaded KV, then computes the rest."""

from __future__ import annotations

from backends.engine.kv_connector import NoKVConnector
from backends.engine.scheduler import Scheduler
from backends.engine.sequence import Sequence, SequenceStatus
from backends.engine.step import StepInput
from tests.fakes import make_scheduler, make_seq, sample_all


class ScriptedConnector:
    """Offers ``external`` tokens of every request; loads finish when ``done`` is called."""

    def __init__(self, external: int, fail: bool = False, hold: bool = False) -> None:
        self.external = external
        self.fail = fail
        self.hold = hold
        self.added: list[int] = []
        self.started: dict[int, list[int]] = {}
        self.ready: list[int] = []
        self.finished: list[int] = []
        self.steps = 0

    def num_external_tokens(self, seq: Sequence, num_local_tokens: int) -> int:
        return self.external

    def start_load(self, seq: Sequence, block_ids: list[int], num_external: int) -> None:
        self.started[seq.seq_id] = block_ids

    def done(self) -> None:
        self.ready.extend(self.started)

    def finished_loads(self) -> list[int]:
        ready, self.ready = self.ready, []
        return ready

    def failed(self, seq_id: int) -> bool:
        return self.fail

    def on_new_request(self, seq: Sequence) -> None:
        self.added.append(seq.seq_id)

    def request_finished(self, seq: Sequence) -> bool:
        self.finished.append(seq.seq_id)
        return self.hold

    def after_step(self, step: StepInput) -> None:
        self.steps += 1


def with_connector(connector: ScriptedConnector) -> Scheduler:
    base = make_scheduler(num_blocks=16, block_size=4)
    return Scheduler(base.config, base.block_manager, connector)


def test_loaded_tokens_are_not_computed_and_cached_only_once_there() -> None:
    connector = ScriptedConnector(external=8)
    scheduler = with_connector(connector)
    seq = make_seq(10)
    scheduler.add(seq)
    assert scheduler.schedule().is_empty  # waiting for the load, blocks allocated
    assert seq.status is SequenceStatus.WAITING_FOR_REMOTE_KV
    assert connector.started[seq.seq_id] == seq.block_table and len(seq.block_table) == 2
    assert scheduler.num_waiting == 1 and scheduler.has_work
    assert scheduler.block_manager.num_cached_blocks == 0  # KV not there yet: not reusable
    connector.done()
    out = scheduler.schedule()
    assert [(item.seq, item.num_new_tokens) for item in out.scheduled] == [(seq, 2)]
    assert scheduler.block_manager.num_cached_blocks == 2 and seq.num_cached_tokens == 8
    scheduler.postprocess(out, sample_all(out.scheduled))
    assert seq.num_output_tokens == 1


def test_a_failed_load_computes_every_token_here() -> None:
    connector = ScriptedConnector(external=8, fail=True)
    scheduler = with_connector(connector)
    seq = make_seq(10)
    scheduler.add(seq)
    scheduler.schedule()
    connector.done()
    out = scheduler.schedule()
    assert [item.num_new_tokens for item in out.scheduled] == [10]


def test_abort_while_loading_frees_the_blocks() -> None:
    connector = ScriptedConnector(external=8)
    scheduler = with_connector(connector)
    free = scheduler.block_manager.num_free_blocks
    seq = make_seq(10)
    scheduler.add(seq)
    scheduler.schedule()
    scheduler.abort(seq)
    assert scheduler.block_manager.num_free_blocks == free and not scheduler.loading
    assert connector.finished == [seq.seq_id]
    connector.done()
    assert scheduler.schedule().is_empty and not scheduler.has_work


def test_the_last_prompt_token_is_always_computed_here() -> None:
    connector = ScriptedConnector(external=100)
    scheduler = with_connector(connector)
    seq = make_seq(6)
    scheduler.add(seq)
    scheduler.schedule()
    connector.done()
    assert [item.num_new_tokens for item in scheduler.schedule().scheduled] == [1]


def test_without_a_connector_nothing_is_loaded() -> None:
    scheduler = make_scheduler()
    assert isinstance(scheduler.kv_connector, NoKVConnector)
    scheduler.add(make_seq(10))
    assert [item.num_new_tokens for item in scheduler.schedule().scheduled] == [10]


def test_a_connector_that_keeps_a_finished_sequences_blocks_frees_them_itself() -> None:
    connector = ScriptedConnector(external=0, hold=True)
    scheduler = with_connector(connector)
    manager = scheduler.block_manager
    seq = make_seq(10, max_tokens=1)
    scheduler.add(seq)
    assert connector.added == [seq.seq_id]
    out = scheduler.schedule()
    scheduler.postprocess(out, sample_all(out.scheduled))
    assert seq.is_finished and connector.finished == [seq.seq_id]
    assert seq.block_table and manager.num_free_blocks == manager.num_blocks - 3
    manager.free(seq)
    assert manager.num_free_blocks == manager.num_blocks
