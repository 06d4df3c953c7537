"""The frames on a worker's socket, which both sides use: one
length-prefixed pickle per frame (what travels: pyfunc_bridge/worker/__init__.py).
Standard library only: the worker imports it before NumPy."""
import pickle
import struct

_HEADER = struct.Struct("<Q")
PICKLE_PROTOCOL = 5
_JOINED = 1 << 16  # a pickle up to this size is joined to its header (one write)


def send(sock, message):
    """Writes the frame of `message` (its pickle).  A large one is written
    after its header rather than joined to it: joining would copy it."""
    data = pickle.dumps(message, protocol=PICKLE_PROTOCOL)
    if len(data) <= _JOINED:
        sock.sendall(_HEADER.pack(len(data)) + data)
    else:
        sock.sendall(_HEADER.pack(len(data)))
        sock.sendall(data)


class FrameReader:
    """Splits what a socket delivers into frames (several per read when the
    other side wrote several).  Reads into one reused buffer of `size` bytes
    (a fresh buffer per read would cost page faults on every call); a frame
    that does not fit it is read into a buffer of its own, dropped once the
    frame is loaded, so that one large frame leaves no large buffer behind."""

    def __init__(self, sock, size=1 << 20):
        self._sock = sock
        self._buffer = bytearray(size)
        self._start = 0   # the first byte not yet parsed
        self._end = 0     # the end of what was received

    def read(self):
        """The messages of the next read (the frames unpickled), at least
        one; [] at end of stream."""
        frames = []
        while not frames:
            if self._end == len(self._buffer):
                # The partial frame to the front (a frame that does not fit
                # the buffer is read by _read_large).
                pending = self._end - self._start
                self._buffer[:pending] = self._buffer[self._start:self._end]
                self._start, self._end = 0, pending
            with memoryview(self._buffer) as view:
                received = self._sock.recv_into(view[self._end:])
                if not received:
                    return []
                self._end += received
                while self._end - self._start >= _HEADER.size:
                    (length,) = _HEADER.unpack_from(view, self._start)
                    begin = self._start + _HEADER.size
                    if self._end < begin + length:
                        if _HEADER.size + length > len(self._buffer):
                            frames.append(pickle.loads(self._read_large(view, begin, length)))
                        break
                    frames.append(pickle.loads(view[begin:begin + length]))
                    self._start = begin + length
            if self._start == self._end:
                self._start = self._end = 0
        return frames

    def _read_large(self, view, begin, length):
        """The whole frame at `begin`, of which the buffer holds the start,
        read on into a buffer of its own; the reused buffer is then empty."""
        have = self._end - begin
        data = bytearray(length)
        data[:have] = view[begin:self._end]
        self._start = self._end = 0
        with memoryview(data) as rest:
            while have < length:
                received = self._sock.recv_into(rest[have:])
                if not received:
                    raise ConnectionResetError("the stream ended inside a frame")
                have += received
        return data
