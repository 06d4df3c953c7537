"""A forked child lets go of its parent's pools' shared memory (pool/process_pool.py
calls ``before_fork``, ``drop_copies`` and ``forget_shared_memory``
from its at-fork hooks).

fork copies every mapping, and a ``MAP_SHARED`` mapping of a memfd stays
shared: the child would keep the parent's arenas (and, through each
``mmap`` object, a descriptor of each memfd) for its whole life, and a
result tensor it inherited would change under it once the parent let go of
the block and its worker reused it.  So, in the child:

- each mapping of a pool's memfd (whoever made it: /proc/self/maps names
  them) is replaced, at the same address, by private memory: a result
  arena's by a copy of its resident pages, taken by the parent just before
  the fork, so that inherited results keep their values; the input arenas
  and control segments, which nothing in the child reads, by zeros;
- each descriptor of a pool's memfd is made to name /dev/null instead, so
  that the object that owns the number (an mmap) closes it when it goes.

The copy costs the parent a copy of the result arenas' written pages at
each fork (and the child that memory).  A block that another thread of the
parent lets go of during the fork may reach the child already reused.
Linux only, as the pool is; through libc (ctypes)."""
import ctypes
import itertools
import mmap
import os

_PROT = {"r": mmap.PROT_READ, "w": mmap.PROT_WRITE, "x": mmap.PROT_EXEC}
_MREMAP_MAYMOVE, _MREMAP_FIXED = 1, 2
_MAP_FAILED = ctypes.c_void_p(-1).value
_KINDS = ("results", "inputs", "control")  # a pool's memfds are named "<pool>-<kind>"

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.mremap.restype = ctypes.c_void_p
_libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int,
                         ctypes.c_void_p]
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]


def _pool_memfd(target, names):
    """The kind ("results", ...) of a memfd path of one of the pools `names`, or None."""
    if not target.startswith("/memfd:"):
        return None
    # (At the last "-": a pool's name may hold one, a kind none.)
    pool, _, kind = target[len("/memfd:"):].removesuffix(" (deleted)").rpartition("-")
    return kind if kind in _KINDS and pool in names else None


def _mappings(names):
    """(start, length, prot, kind) of this process's mappings of the pools' memfds."""
    found = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) < 6:
                continue
            kind = _pool_memfd(fields[5].rstrip("\n"), names)
            if kind is not None:
                start, end = (int(x, 16) for x in fields[0].split("-"))
                prot = sum(_PROT.get(flag, 0) for flag in fields[1][:3])  # (distinct bits)
                found.append((start, end - start, prot, kind))
    return found


def _copy(start, length, prot):
    """A private anonymous mapping of `length` bytes (protection `prot`) that
    holds a copy of the resident pages at `start` (the others read as zeros,
    as they did)."""
    tmp = _zeros(length, mmap.PROT_READ | mmap.PROT_WRITE)
    page = mmap.PAGESIZE
    pages = length // page
    if prot & mmap.PROT_READ:
        vector = ctypes.create_string_buffer(pages)
        resident = vector.raw if _libc.mincore(start, length, vector) == 0 else b"\1" * pages
        i = 0
        for is_resident, run in itertools.groupby(resident, lambda byte: byte & 1):
            count = len(list(run))
            if is_resident:  # each run of resident pages, in one copy
                ctypes.memmove(tmp + i * page, start + i * page, count * page)
            i += count
    if prot != mmap.PROT_READ | mmap.PROT_WRITE:
        _libc.mprotect(tmp, length, prot)
    return tmp


def _zeros(length, prot):
    """A private anonymous mapping of `length` bytes (zeros), protection `prot`."""
    tmp = _libc.mmap(None, length, prot, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    if tmp in (None, _MAP_FAILED):
        raise OSError(ctypes.get_errno(), "pyfunc_bridge: mmap of private memory for a fork")
    return tmp


def _move(tmp, start, length):
    """Puts the mapping `tmp` at `start`, in place of what was mapped there."""
    moved = _libc.mremap(tmp, length, length, _MREMAP_MAYMOVE | _MREMAP_FIXED, start)
    if moved != start:
        error = ctypes.get_errno()
        _libc.munmap(tmp, length)
        raise OSError(error, "pyfunc_bridge: mremap over a forked child's pool mapping")


# (start, length) -> a copy of that result arena mapping, from just before a
# fork to just after it (in the parent: dropped; in the child: moved there).
_copies = {}


def before_fork(names):
    """In the parent, just before a fork: copies of the result arenas' pages
    as they are at the fork.  (Made here, not in the child: once the fork
    returns, the parent may let go of a block, and its worker write over
    it, before the child ran at all.)"""
    for start, length, prot, kind in _mappings(names) if names else ():
        if kind == "results":
            _copies[(start, length)] = _copy(start, length, prot)


def drop_copies():
    """Unmaps the copies left: all of them in the parent after a fork; in the
    child, those of arenas unmapped meanwhile."""
    while _copies:
        (_, length), tmp = _copies.popitem()
        _libc.munmap(tmp, length)


def forget_shared_memory(names):
    """In a forked child: the pools `names` (their memfds' names start with
    one) are the parent's; their mappings and descriptors are let go of as
    above."""
    for start, length, prot, kind in _mappings(names):
        tmp = _copies.pop((start, length), None)
        _move(tmp if tmp is not None else _zeros(length, prot), start, length)
    drop_copies()
    null = None
    try:
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue  # the descriptor listdir itself used
            if _pool_memfd(target, names) is not None:
                if null is None:
                    null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
                os.dup2(null, int(fd), inheritable=False)
    finally:
        if null is not None:
            os.close(null)
