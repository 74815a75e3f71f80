"""A pickle reader for PyTorch checkpoints that imports and calls nothing: an allowlist, not a denylist.

``torch.save`` writes a state dict as a pickle whose only code references are a handful of torch functions that
rebuild tensors from storages. This module runs the pickle opcodes those files use on its own stack machine and
gives each allowed reference a meaning here (``collections.OrderedDict`` -> a dict, ``torch._utils._rebuild_tensor_v2``
-> a :class:`TensorRecord`, the ``torch.*Storage`` names -> dtype tags of persistent ids). Any other global, any
``REDUCE`` of something not on the list, ``BUILD`` / ``SETITEM(S)`` on anything but a dict, ``INST`` / ``OBJ`` /
``NEWOBJ(_EX)``, extension codes and the rest of the opcode table are refused with a :class:`~uaii.ir.FormatError`
naming the file, the byte offset and the opcode or global. Why not ``pickle`` with ``find_class`` overridden, or
torch's ``weights_only``: both execute ``REDUCE``/``BUILD`` through Python's machinery, and scanners and
restricted unpicklers built that way have been bypassed again and again (CVE-2025-32434, CVE-2026-24747); here
no opcode can reach Python's import or call machinery at all.

Bounds: the memo holds at most :data:`MAX_MEMO` entries, the stack at most :data:`MAX_STACK` items, containers nest
at most :data:`MAX_DEPTH` deep, integers have at most 64 bytes, and every string or bytes length is checked against
what is left of the data before it is read. The machine never recurses, so a deep pickle cannot exhaust the
interpreter's stack.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from uaii.ir import DType, FormatError

MAX_MEMO = 1 << 20
MAX_STACK = 1 << 20
MAX_DEPTH = 64

STORAGE_TYPES: dict[str, tuple[DType, int]] = {
    "FloatStorage": (DType.F32, 4), "HalfStorage": (DType.F16, 2), "BFloat16Storage": (DType.BF16, 2),
    "DoubleStorage": (DType.F64, 8), "LongStorage": (DType.I64, 8), "IntStorage": (DType.I32, 4),
    "ShortStorage": (DType.I16, 2), "CharStorage": (DType.I8, 1), "ByteStorage": (DType.U8, 1),
    "BoolStorage": (DType.BOOL, 1),
}
"""torch's typed storage names -> (dtype, bytes per element); they appear only as tags inside persistent ids."""

TORCH_DTYPES: dict[str, DType] = {
    "float32": DType.F32, "float16": DType.F16, "bfloat16": DType.BF16, "float64": DType.F64, "int64": DType.I64,
    "int32": DType.I32, "int16": DType.I16, "int8": DType.I8, "uint8": DType.U8, "bool": DType.BOOL,
}
"""``torch.<dtype>`` globals (``_rebuild_tensor_v3`` names its dtype so)."""


@dataclass(frozen=True)
class StorageTag:
    """A ``torch.<Name>Storage`` global: only meaningful as the type inside a persistent id."""

    name: str


@dataclass(frozen=True)
class DTypeTag:
    name: str


@dataclass(frozen=True)
class Allowed:
    """One of the functions a checkpoint may name: what REDUCE does with it is decided here, by name."""

    module: str
    name: str


@dataclass(frozen=True)
class TensorRecord:
    """A tensor as the checkpoint describes it: a view (offset and strides in elements) of a storage, which the
    persistent-id loader resolved to whatever the container format keeps (``storage``)."""

    storage: Any
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    where: int  # byte offset of the REDUCE that built it, for errors


ORDERED_DICT = Allowed("collections", "OrderedDict")
REBUILD_V2 = Allowed("torch._utils", "_rebuild_tensor_v2")
REBUILD_V3 = Allowed("torch._utils", "_rebuild_tensor_v3")
PARAMETER = Allowed("torch._utils", "_rebuild_parameter")
PARAMETER_STATE = Allowed("torch._utils", "_rebuild_parameter_with_state")
_FUNCTIONS = {(a.module, a.name): a for a in (ORDERED_DICT, REBUILD_V2, REBUILD_V3, PARAMETER, PARAMETER_STATE)}


class CheckpointDict(dict[Any, Any]):
    """An OrderedDict of the checkpoint (dicts keep their order); ``attributes`` holds what BUILD set on it
    (a state dict's ``_metadata``)."""

    attributes: dict[str, Any]

    def __init__(self) -> None:
        super().__init__()
        self.attributes = {}


def _global(module: str, name: str, fail: Callable[[str], NoReturn]) -> Any:
    found = _FUNCTIONS.get((module, name))
    if found is not None:
        return found
    if module == "torch" and name in STORAGE_TYPES:
        return StorageTag(name)
    if module == "torch" and name in TORCH_DTYPES:
        return DTypeTag(name)
    hint = ("; a whole module pickled (torch.save(model))? save model.state_dict() instead"
            if module.startswith(("torch.nn", "transformers", "__main__")) else "")
    fail(f"refused global {module}.{name}: a checkpoint may name only collections.OrderedDict, "
         "torch._utils._rebuild_tensor_v2/_v3, torch._utils._rebuild_parameter(_with_state), torch's storage "
         f"types and dtypes{hint}")


def _int_tuple(x: Any) -> bool:
    return isinstance(x, tuple) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in x)


def _depth(x: Any, depths: dict[int, int]) -> int:
    return depths.get(id(x), 0) if isinstance(x, (tuple, list, dict)) else 0


def load(data: bytes | memoryview, path: str, base: int = 0,
         persistent_load: Callable[[Any, int], Any] | None = None) -> Any:
    """Run the pickle in ``data`` (which sits at byte ``base`` of ``path``, for error offsets); ``persistent_load
    (pid, offset)`` resolves BINPERSID (a checkpoint's storages). Returns the unpickled object."""
    return load_prefix(data, path, base, persistent_load)[0]


def load_prefix(data: bytes | memoryview, path: str, base: int = 0,
                persistent_load: Callable[[Any, int], Any] | None = None) -> tuple[Any, int]:
    """:func:`load` of the pickle at the start of ``data``; also returns where it ended (the byte after its STOP:
    the legacy format writes pickles and raw data back to back)."""
    buf = memoryview(data).cast("B")
    n = len(buf)
    pos = 0
    stack: list[Any] = []
    marks: list[int] = []
    memo: dict[int, Any] = {}
    depths: dict[int, int] = {}  # id(container) -> nesting depth; containers live as long as the stack/memo do
    keep: list[Any] = []  # every container made, so that ids stay unique while depths refers to them

    def fail(message: str, at: int | None = None) -> NoReturn:
        raise FormatError(message, path=path, offset=base + (op_at if at is None else at), component="torch")

    def take(k: int) -> memoryview:
        nonlocal pos
        if k < 0 or pos + k > n:
            fail(f"the pickle ends inside an argument ({k} bytes wanted, {n - pos} left)")
        out = buf[pos:pos + k]
        pos += k
        return out

    def push(x: Any) -> None:
        if len(stack) >= MAX_STACK:
            fail(f"the pickle's stack grows past {MAX_STACK} items")
        stack.append(x)

    def pop() -> Any:
        if not stack or (marks and len(stack) <= marks[-1]):
            fail("the pickle pops from an empty stack")
        return stack.pop()

    def pop_mark() -> list[Any]:
        if not marks:
            fail("the pickle has no MARK to pop to")
        at = marks.pop()
        items = stack[at:]
        del stack[at:]
        return items

    def grow(container: Any, items: Any) -> None:
        """``container`` holds ``items`` now: its depth is at least one more than theirs."""
        d = max(depths.get(id(container), 1), 1 + max((_depth(x, depths) for x in items), default=0))
        if d > MAX_DEPTH:
            fail(f"containers nest more than {MAX_DEPTH} deep")
        depths[id(container)] = d

    def made(container: Any, items: Any) -> Any:
        grow(container, items)
        keep.append(container)
        return container

    def memo_put(i: int) -> None:
        if not stack:
            fail("the pickle memoizes an empty stack")
        if len(memo) >= MAX_MEMO and i not in memo:
            fail(f"the pickle's memo grows past {MAX_MEMO} entries")
        memo[i] = stack[-1]

    def memo_get(i: int) -> None:
        if i not in memo:
            fail(f"the pickle reads memo entry {i}, which was never written")
        push(memo[i])

    def text(k: int) -> str:
        try:
            return bytes(take(k)).decode("utf-8")
        except UnicodeDecodeError:
            fail("a string is not valid UTF-8")

    def key_ok(k: Any) -> bool:
        return isinstance(k, (str, int, bytes)) or (isinstance(k, tuple) and all(isinstance(v, (str, int))
                                                                                  for v in k))

    def setitems(target: Any, pairs: list[Any]) -> None:
        if not isinstance(target, dict):
            fail(f"SETITEM(S) on a {type(target).__name__}: only dicts take items")
        if len(pairs) % 2:
            fail("SETITEMS with an odd number of items")
        for i in range(0, len(pairs), 2):
            if not key_ok(pairs[i]):
                fail(f"a dict key of type {type(pairs[i]).__name__}")
            target[pairs[i]] = pairs[i + 1]
        grow(target, pairs[1::2])

    def reduce(fn: Any, args: Any) -> Any:
        if not isinstance(fn, Allowed):
            fail(f"REDUCE calls a {type(fn).__name__} ({fn!r:.60}); only the allowed torch functions are called")
        if not isinstance(args, tuple):
            fail("REDUCE's arguments are not a tuple")
        if fn is ORDERED_DICT:
            if args:
                fail("collections.OrderedDict is built with arguments; torch.save builds it empty")
            return made(CheckpointDict(), ())
        if fn in (REBUILD_V2, REBUILD_V3):
            want = (6, 7) if fn is REBUILD_V2 else (7, 8)
            if len(args) not in want:
                fail(f"{fn.name} takes {want[0]} or {want[1]} arguments, found {len(args)}")
            storage, offset, size, stride = args[:4]
            if fn is REBUILD_V3 and not isinstance(args[6], DTypeTag):
                fail(f"{fn.name}'s dtype is a {type(args[6]).__name__}, not a torch dtype")
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0 or not _int_tuple(size) \
                    or not _int_tuple(stride) or len(size) != len(stride):
                fail(f"{fn.name}: offset, size and stride must be non-negative integers of matching rank, found "
                     f"{offset!r:.40}, {size!r:.80}, {stride!r:.80}")
            if not isinstance(args[5], dict):
                fail(f"{fn.name}: backward hooks must be an (empty) OrderedDict")
            return TensorRecord(storage, offset, tuple(size), tuple(stride), base + op_at)
        if fn in (PARAMETER, PARAMETER_STATE):
            if len(args) != (3 if fn is PARAMETER else 4) or not isinstance(args[0], TensorRecord):
                fail(f"{fn.name} takes a tensor and {2 if fn is PARAMETER else 3} more arguments")
            return args[0]
        fail(f"REDUCE of {fn.module}.{fn.name}")

    op_at = 0
    while True:
        if pos >= n:
            fail("the pickle ends without STOP", n)
        op_at = pos
        op = buf[pos]
        pos += 1
        if op == 0x80:      # PROTO
            if take(1)[0] > 5:
                fail("pickle protocol above 5")
        elif op == 0x95:    # FRAME: a length hint only
            take(8)
        elif op == 0x2E:    # STOP
            if len(stack) != 1 or marks:
                fail(f"STOP with {len(stack)} items on the stack")
            return stack[0], pos
        elif op == 0x28:    # MARK
            marks.append(len(stack))
        elif op == 0x7D:    # EMPTY_DICT
            push(made(CheckpointDict(), ()))
        elif op == 0x5D:    # EMPTY_LIST
            push(made([], ()))
        elif op == 0x29:    # EMPTY_TUPLE
            push(())
        elif op == 0x74:    # TUPLE
            items = pop_mark()
            push(made(tuple(items), items))
        elif op in (0x85, 0x86, 0x87):  # TUPLE1..3
            k = op - 0x84
            items = [pop() for _ in range(k)][::-1]
            push(made(tuple(items), items))
        elif op == 0x6C:    # LIST
            items = pop_mark()
            push(made(list(items), items))
        elif op == 0x64:    # DICT
            items = pop_mark()
            setitems(d := made(CheckpointDict(), ()), items)
            push(d)
        elif op == 0x58:    # BINUNICODE
            push(text(struct.unpack("<I", take(4))[0]))
        elif op == 0x8C:    # SHORT_BINUNICODE
            push(text(take(1)[0]))
        elif op == 0x8D:    # BINUNICODE8
            push(text(struct.unpack("<Q", take(8))[0]))
        elif op == 0x43:    # SHORT_BINBYTES
            push(bytes(take(take(1)[0])))
        elif op == 0x42:    # BINBYTES
            push(bytes(take(struct.unpack("<I", take(4))[0])))
        elif op == 0x4A:    # BININT
            push(struct.unpack("<i", take(4))[0])
        elif op == 0x4B:    # BININT1
            push(take(1)[0])
        elif op == 0x4D:    # BININT2
            push(struct.unpack("<H", take(2))[0])
        elif op == 0x8A:    # LONG1
            k = take(1)[0]
            if k > 64:
                fail(f"an integer of {k} bytes (at most 64)")
            push(int.from_bytes(take(k), "little", signed=True))
        elif op == 0x47:    # BINFLOAT
            push(struct.unpack(">d", take(8))[0])
        elif op == 0x4E:    # NONE
            push(None)
        elif op == 0x88:    # NEWTRUE
            push(True)
        elif op == 0x89:    # NEWFALSE
            push(False)
        elif op == 0x71:    # BINPUT
            memo_put(take(1)[0])
        elif op == 0x72:    # LONG_BINPUT
            memo_put(struct.unpack("<I", take(4))[0])
        elif op == 0x94:    # MEMOIZE
            memo_put(len(memo))
        elif op == 0x68:    # BINGET
            memo_get(take(1)[0])
        elif op == 0x6A:    # LONG_BINGET
            memo_get(struct.unpack("<I", take(4))[0])
        elif op == 0x30:    # POP
            pop()
        elif op == 0x31:    # POP_MARK
            pop_mark()
        elif op == 0x32:    # DUP
            x = pop()
            push(x)
            push(x)
        elif op == 0x63:    # GLOBAL: "module\nname\n"
            end1 = bytes(buf[pos:min(n, pos + 256)]).find(b"\n")
            if end1 < 0:
                fail("GLOBAL's module name is not terminated within 256 bytes")
            module = text(end1)
            take(1)
            end2 = bytes(buf[pos:min(n, pos + 256)]).find(b"\n")
            if end2 < 0:
                fail("GLOBAL's name is not terminated within 256 bytes")
            name = text(end2)
            take(1)
            push(_global(module, name, fail))
        elif op == 0x93:    # STACK_GLOBAL
            name, module = pop(), pop()
            if not isinstance(module, str) or not isinstance(name, str):
                fail("STACK_GLOBAL's module and name are not strings")
            push(_global(module, name, fail))
        elif op == 0x52:    # REDUCE
            args = pop()
            fn = pop()
            push(reduce(fn, args))
        elif op == 0x51:    # BINPERSID
            pid = pop()
            if persistent_load is None:
                fail("a persistent id outside a checkpoint's main pickle")
            push(persistent_load(pid, base + op_at))
        elif op == 0x73:    # SETITEM
            value, key = pop(), pop()
            setitems(stack[-1] if stack else None, [key, value])
        elif op == 0x75:    # SETITEMS
            items = pop_mark()
            setitems(stack[-1] if stack else None, items)
        elif op in (0x61, 0x65):    # APPEND, APPENDS
            items = [pop()] if op == 0x61 else pop_mark()
            target = stack[-1] if stack else None
            if not isinstance(target, list):
                fail(f"{'APPEND' if op == 0x61 else 'APPENDS'} to a {type(target).__name__}: only lists take items")
            target.extend(items)
            grow(target, items)
        elif op == 0x62:    # BUILD: only a state dict's attributes (its _metadata)
            state = pop()
            target = stack[-1] if stack else None
            if not isinstance(target, CheckpointDict) or not isinstance(state, dict) \
                    or not all(isinstance(k, str) for k in state):
                fail(f"BUILD on a {type(target).__name__} with a {type(state).__name__}: only a dict's attributes "
                     "may be set")
            target.attributes.update(state)
        else:
            names = {0x69: "INST", 0x6F: "OBJ", 0x81: "NEWOBJ", 0x92: "NEWOBJ_EX", 0x82: "EXT1", 0x83: "EXT2",
                     0x84: "EXT4", 0x50: "PERSID", 0x96: "BYTEARRAY8", 0x97: "NEXT_BUFFER",
                     0x98: "READONLY_BUFFER"}
            fail(f"refused pickle opcode {names.get(op, repr(bytes([op])))}: not one torch.save writes")


__all__ = ["MAX_DEPTH", "MAX_MEMO", "MAX_STACK", "STORAGE_TYPES", "TORCH_DTYPES", "CheckpointDict", "DTypeTag",
           "StorageTag", "TensorRecord", "load", "load_prefix"]
