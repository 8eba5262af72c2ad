"""Property: however an agent chunks and resends a rank's output (any chunk sizes, any
rewinds to an earlier line boundary, as after reconnects), the stored lines are exactly
the output's lines, once each, in order (SQLite in memory; Redis shares the logic in
broker/store/logs_common.py and the conformance tests pin both)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.store.sqlite import SQLiteStore
from computebroker.v1 import logs_pb2 as lpb

texts = st.lists(st.text(alphabet="aé€ x", min_size=0, max_size=6), min_size=1, max_size=25)


@settings(max_examples=60, deadline=None)
@given(lines=texts, data=st.data())
def test_any_chunking_with_rewinds_stores_each_line_once(lines: list[str], data: st.DataObject) -> None:
    sizes = [len(x.encode()) + 1 for x in lines]
    starts = [sum(sizes[:i]) for i in range(len(lines))]
    store = SQLiteStore(":memory:")
    i = 0
    while i < len(lines):
        n = data.draw(st.integers(1, len(lines) - i), label="chunk length")
        store.append_logs("j", lpb.LogChunk(job_id="j", attempt=1, rank=0, stream="stdout",
                                            offset=starts[i], lines=lines[i:i + n],
                                            sizes=sizes[i:i + n]), 1 << 20)
        i += n
        if data.draw(st.booleans(), label="rewind"):
            i = data.draw(st.integers(0, i), label="rewind to line")
    stored, dropped = store.read_logs("j", 1)
    assert [ln.text for ln in stored] == lines and dropped == 0
    assert [ln.seq for ln in stored] == list(range(1, len(lines) + 1))
    (off,) = store.log_offsets("j")
    assert off.end_offset == sum(sizes)
    store.close()
