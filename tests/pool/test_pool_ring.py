"""The rings of a worker's control segment (src/pool/ring.c, records.c,
through the worker module's Channel): messages across the wrap-around, a
full ring, records of every shape, malformed messages, closing; and, across
two processes started with subprocess (never fork), wake-ups only when the
consumer sleeps, one per batch, and a producer that sleeps for room."""
import mmap
import os
import subprocess
import threading
import time

import pytest

from fresh_python import started_python

from pyfunc_bridge import _pool as pw

PACKAGE = os.path.dirname(os.path.abspath(pw.__file__))
R, Q = pw.REQUESTS, pw.REPLIES


def segment(ring_slots):
    """(fd, mapping) of a fresh control segment's memfd."""
    fd = os.memfd_create("test-pool-control")
    size = pw.control_bytes(ring_slots)
    os.ftruncate(fd, size)
    return fd, mmap.mmap(fd, size)


@pytest.fixture
def channel():
    fd, mapping = segment(8)
    os.close(fd)
    yield pw.Channel(mapping, create=True, ring_slots=8)


def test_layout_sizes():
    assert pw.control_bytes(8) == 512 + 2 * 8 * 64


def test_messages_cross_the_end_of_the_ring_intact(channel):
    """3-slot messages in an 8-slot ring: every position of the wrap-around."""
    for i in range(40):
        words = [i, 2**64 - 1 - i, *range(i % 11)]  # 1 or 2 slots of words
        assert channel.post(R, pw.MSG_WORDS, words, call_id=i, token=7, stamp=i * 3)
        [message] = channel.receive(R)
        assert message.kind == pw.MSG_WORDS and message.call_id == i
        assert message.token == 7 and message.stamp == i * 3 and message.items == words
    assert channel.available(R) == 0 and channel.room(R) == 8


def test_fits_counts_a_message_in_slots_against_the_ring(channel):
    """Channel.fits (pfb_pool_message_fits): a header and each record's
    slots; what passes it posts, what does not would never have room."""
    record = lambda ndim: (2, 32, 1, 0, 0, 0, (1,) * ndim)  # noqa: E731
    assert channel.fits([record(4)] * 7) and not channel.fits([record(0)] * 8)
    assert channel.fits([record(5)] * 3) and not channel.fits([record(5)] * 4)
    assert channel.post(Q, pw.MSG_DONE, [record(5)] * 3)
    with pytest.raises(ValueError, match="cannot fit a ring of 8"):
        channel.post(Q, pw.MSG_DONE, [record(0)] * 8)


@pytest.mark.parametrize("ring_slots", [2, 8, 64, 1024])
def test_a_words_message_fills_at_most_64_slots_and_the_ring(ring_slots):
    """words_per_message (records.h, the one rule for the dispatcher's
    hand-backs and the worker's INPUTS_BACK): that many words post as one
    message of at most 64 slots, never more than the ring."""
    fd, mapping = segment(ring_slots)
    os.close(fd)
    ring = pw.Channel(mapping, create=True, ring_slots=ring_slots)
    words = pw.words_per_message(ring_slots)
    assert words == 8 * (min(ring_slots, 64) - 1)
    assert ring.post(R, pw.MSG_INPUTS_BACK, list(range(words)), timeout=0)
    assert ring.available(R) == min(ring_slots, 64)
    [message] = ring.receive(R)
    assert message.items == list(range(words))


def test_a_full_ring_refuses_until_the_consumer_reads(channel):
    assert all(channel.post(R, pw.MSG_WORDS, [i], call_id=i) for i in range(4))  # 2 slots each
    assert channel.room(R) == 0
    start = time.monotonic()
    assert channel.post(R, pw.MSG_WORDS, [9], timeout=0) is False
    assert channel.post(R, pw.MSG_WORDS, [9], timeout=0.05) is False
    assert time.monotonic() - start >= 0.05
    assert [m.call_id for m in channel.receive(R, limit=1)] == [0]
    assert channel.post(R, pw.MSG_WORDS, [9], call_id=4, timeout=0)
    assert [m.call_id for m in channel.receive(R)] == [1, 2, 3, 4]


def test_a_message_longer_than_the_ring_is_refused(channel):
    with pytest.raises(ValueError, match="cannot fit a ring of 8"):
        channel.post(R, pw.MSG_WORDS, list(range(8 * 8)))  # 9 slots
    assert channel.room(R) == 8


def test_tensor_records_of_every_shape(channel):
    tensors = [
        (2, 32, 1, 0, 0, 64, ()),                                    # 0-d
        (0, 64, 1, 0, 64, 0, (0,)),                                   # empty, no block
        (1, 8, 1, 0, 128, 192, (3, 1, 2, 5)),                         # 4 dims inline
        (5, 64, 1, 0, 320, 64, (1, 2, 3, 4, 5)),                      # one dims slot
        (3, 128, 1, pw.TENSOR_STRINGS, 1 << 40, 128, (2,)),           # strings
        (6, 8, 1, 0, 4096, 64, tuple(range(1, 14))),                  # two dims slots
        (2, 16, 1, pw.TENSOR_PICKLED | pw.TENSOR_SHARED, 8, 64, ()),
    ]
    for chunk in (tensors[:3], tensors[3:5], tensors[5:]):
        assert channel.post(Q, pw.MSG_DONE, chunk, call_id=5, flags=1, status=0,
                                    block=(64, 17))
        [message] = channel.receive(Q)
        assert message.items == chunk and message.block == (64, 17) and message.flags == 1


def test_a_shape_beyond_the_limit_is_refused(channel):
    with pytest.raises(ValueError, match="65 dimensions"):
        channel.post(R, pw.MSG_CALL, [(2, 32, 1, 0, 0, 64, (1,) * 65)])
    with pytest.raises(ValueError, match="negative dimension"):
        channel.post(R, pw.MSG_CALL, [(2, 32, 1, 0, 0, 64, (2, -1))])
    with pytest.raises(ValueError, match="ring must be"):
        channel.receive(2)
    assert channel.available(R) == 0


def test_a_malformed_message_is_an_error_not_a_read_past_it():
    fd, mapping = segment(8)
    os.close(fd)
    channel = pw.Channel(mapping, create=True, ring_slots=8)
    channel.post(R, pw.MSG_WORDS, [1, 2, 3])
    slots = 512  # the request ring's first slot
    mapping[slots + 2:slots + 4] = (9).to_bytes(2, "little")  # claims 9 slots of 2 published
    with pytest.raises(OSError, match="malformed message"):
        channel.receive(R)
    mapping[slots + 2:slots + 4] = (0).to_bytes(2, "little")
    with pytest.raises(OSError, match="malformed message"):
        channel.receive(R)


def test_attaching_checks_the_layout():
    fd, mapping = segment(8)
    os.close(fd)
    with pytest.raises(ValueError, match="not a pool control segment"):
        pw.Channel(mapping)  # never laid out
    with pytest.raises(ValueError, match="power of two"):
        pw.Channel(mapping, create=True, ring_slots=6)
    with pytest.raises(ValueError, match="cannot hold"):
        pw.Channel(mapping, create=True, ring_slots=16)
    pw.Channel(mapping, create=True, ring_slots=8)
    assert pw.Channel(mapping).ring_slots == 8
    with pytest.raises(BufferError, match="not writable"):
        pw.Channel(bytes(2048))


def test_closing_ends_waits_after_the_ring_is_drained(channel):
    channel.post(R, pw.MSG_WORDS, [1])
    channel.close()
    assert channel.wait(R, timeout=1)  # a message is still there
    assert len(channel.receive(R)) == 1
    with pytest.raises(pw.ChannelClosed):
        channel.wait(R, timeout=1)
    with pytest.raises(pw.ChannelClosed):
        channel.post(R, pw.MSG_WORDS, [2])


def test_a_post_waiting_for_room_keeps_its_message_while_another_thread_reads():
    """One process, two threads: a post that waits for room (the GIL
    released) while the other thread reads a message must still publish its
    own message.  Both once shared one buffer: the post published the
    message just read instead (a reply seen twice, another never)."""
    fd, mapping = segment(8)
    os.close(fd)
    channel = pw.Channel(mapping, create=True, ring_slots=8)
    for i in range(4):  # 2 slots each: full
        assert channel.post(R, pw.MSG_WORDS, [i], call_id=i, timeout=0)
    posted = []
    poster = threading.Thread(target=lambda: posted.append(
        channel.post(R, pw.MSG_WORDS, [99], call_id=99, timeout=30)))
    poster.start()
    try:
        wait_until(lambda: channel.sleeps(R) >= 1)  # asleep, waiting for room
        assert [m.call_id for m in channel.receive(R, limit=1)] == [0]
    finally:
        poster.join(timeout=30)
    assert posted == [True]
    got = channel.receive(R)
    assert [(m.call_id, m.items) for m in got] == [(1, [1]), (2, [2]), (3, [3]), (99, [99])]


def test_no_wake_when_the_consumer_is_awake(channel):
    """In one process the consumer never sleeps: posts and notifies make no
    FUTEX_WAKE; a wait with a message there returns without sleeping."""
    for i in range(3):
        channel.post(R, pw.MSG_WORDS, [i])
        assert channel.notify(R) is False
    assert channel.wait(R, timeout=0) and channel.sleeps(R) == 0
    assert channel.wait(Q, timeout=0.01) is False and channel.sleeps(Q) == 1
    assert channel.wakes(R) == 0


def test_a_spin_finds_a_message_without_announcing_a_sleep(channel):
    """The worker's look before it sleeps (Channel.spin): bounded, and never
    flagged, so the producer's notify makes no wake-up for what it finds."""
    start = time.monotonic()
    assert channel.spin(R, 2_000_000) is False  # empty: gives up after 2 ms
    assert time.monotonic() - start >= 0.002
    assert channel.sleeps(R) == 0 and not channel.consumer_sleeping(R)
    flags = []

    def produce():
        flags.append(channel.consumer_sleeping(R))
        channel.post(R, pw.MSG_WORDS, [5], call_id=5)
        flags.append(channel.notify(R))

    producer = threading.Timer(0.01, produce)
    producer.start()
    try:
        assert channel.spin(R, 30_000_000_000) is True  # returns once posted
    finally:
        producer.join()
    assert flags == [False, False]  # not flagged: the notify woke nobody
    assert [m.call_id for m in channel.receive(R)] == [5]
    assert channel.wakes(R) == 0 and channel.sleeps(R) == 0


# ------------------------------------------------------ two processes --

# The consumer: an echo of the request ring onto the reply ring, one reply
# per request: (messages it read after that wake-up, its sleeps so far).  A
# request with token 1 makes it pause words[0] ms before it reads on.
_ECHO = "pool/ring_echo.py"


@pytest.fixture
def echo():
    """(channel, the consumer process) over a 16-slot control segment."""
    fd, mapping = segment(16)
    channel = pw.Channel(mapping, create=True, ring_slots=16)
    try:
        with started_python(_ECHO, PACKAGE, fd, pass_fds=[fd], stdout=subprocess.PIPE,
                            text=True) as child:
            os.close(fd)
            fd = None
            assert child.stdout.readline().strip() == "ready"
            yield channel, child
            channel.close()
            assert child.wait(timeout=30) == 0
    finally:
        if fd is not None:
            os.close(fd)


def replies(channel, count, timeout=30):
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        assert channel.wait(Q, timeout=max(0.0, deadline - time.monotonic())), "no reply"
        got += channel.receive(Q)
    return got


def wait_until(condition, timeout=30):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_sleeping_consumer_is_woken_once_per_batch(echo):
    channel, _ = echo
    wait_until(lambda: channel.consumer_sleeping(R))  # asleep on the request ring
    for i in range(6):  # 2 slots each: 12 of 16
        channel.post(R, pw.MSG_WORDS, [i], call_id=i)
    assert channel.wakes(R) == 0
    assert channel.notify(R) is True  # it slept: one FUTEX_WAKE for the six
    assert channel.wakes(R) == 1
    got = replies(channel, 6)
    assert [m.call_id for m in got] == list(range(6))
    assert all(m.items[0] == 6 for m in got)  # all six read after one wake-up
    assert got[0].items[1] == 1  # it slept once to get them


def test_a_producer_sleeps_for_room_and_is_woken_by_the_consumer(echo):
    """The producer fills the request ring while the consumer pauses, then
    sleeps for room until the consumer reads on.  Replies are read on a
    second thread meanwhile, as the pool's parent reads them: the consumer
    answers every request on a 16-slot reply ring, so a producer that read no
    replies would leave it waiting for room on that ring, and both would
    wait for ever."""
    channel, _ = echo
    channel.post(R, pw.MSG_WORDS, [300], call_id=0, token=1)  # the consumer pauses
    channel.notify(R)
    assert [m.call_id for m in replies(channel, 1)] == [0]
    got, failed = [], []

    def read():
        try:
            got.extend(replies(channel, 29))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failed.append(exc)
    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(1, 9):  # fills the ring: 8 messages of 2 slots
            assert channel.post(R, pw.MSG_WORDS, [i], call_id=i, timeout=0)
        assert channel.room(R) == 0
        start = time.monotonic()
        for i in range(9, 30):  # waits for room while the consumer pauses, then reads
            assert channel.post(R, pw.MSG_WORDS, [i], call_id=i, timeout=30)
            channel.notify(R)
        assert time.monotonic() - start > 0.1 and channel.sleeps(R) >= 1
    finally:
        reader.join(timeout=60)
    assert not reader.is_alive() and not failed, failed
    assert [m.call_id for m in got] == list(range(1, 30))
    assert max(m.items[2] for m in got) >= 1  # the consumer woke the producer


def test_a_producer_that_waits_for_room_wakes_the_sleeping_consumer_first(echo):
    """Messages published without a notify fill the ring of a consumer that
    sleeps: the post that then waits for room must ring it, since nothing
    else will make room.  (The dispatcher's hand-backs once filled a sleeping
    worker's request ring so, and the call posted after them waited out its
    deadline.)  The consumer's replies come in one batch too, more than the
    reply ring holds, before its notify: its own wait for room must ring
    this reader the same way."""
    channel, _ = echo
    wait_until(lambda: channel.consumer_sleeping(R))
    for i in range(8):  # 2 slots each: full, and no notify
        assert channel.post(R, pw.MSG_WORDS, [i], call_id=i, timeout=0)
    assert channel.room(R) == 0 and channel.wakes(R) == 0
    got, failed = [], []

    def read():
        try:
            got.extend(replies(channel, 9))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failed.append(exc)
    reader = threading.Thread(target=read)
    reader.start()
    try:
        wait_until(lambda: channel.consumer_sleeping(Q))  # the reader sleeps too
        assert channel.post(R, pw.MSG_WORDS, [8], call_id=8, timeout=30)
        assert channel.wakes(R) == 1  # rung once, by the wait for room
        channel.notify(R)
    finally:
        reader.join(timeout=60)
    assert not reader.is_alive() and not failed, failed
    assert [m.call_id for m in got] == list(range(9))


def test_round_trips_in_order_without_lost_wake_ups(echo):
    """Hundreds of small batches, each waited for before the next, so that
    either side may be asleep or about to sleep at every post: a lost
    wake-up would hang a batch (the wait's timeout fails the test)."""
    channel, _ = echo
    sent = 0
    for batch in range(300):
        size = batch % 5 + 1
        for _ in range(size):
            channel.post(R, pw.MSG_WORDS, [sent], call_id=sent, timeout=30)
            sent += 1
        channel.notify(R)
        assert [m.call_id for m in replies(channel, size)] == list(range(sent - size, sent))
