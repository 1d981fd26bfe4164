"""Weight streaming: run a model whose weights do not all fit on the compute device.

A model names its repeated blocks (`streamable_blocks()`: the DiT's 48 transformer blocks, Gemma's 48 decoder
layers). `place` puts everything else and as many whole blocks as the budget allows on the device; the remaining
blocks' tensors stay in pinned host memory and `BlockStreamer` copies them, one block ahead, into two device slots
on a side stream, so the copy of block i+1 overlaps the compute of block i. A streamed block's tensors are swapped
into the module only for the duration of its forward; outside it the module holds its host tensors, so moving or
unloading the model needs no knowledge of the streamer.

The streamed blocks are spread evenly between the resident ones rather than trailing them: the copy of a streamed
block then overlaps the compute of the resident blocks before it too, so a step costs about max(copy, compute)
instead of their sum over the streamed tail.

With `keep_host`, `offload` copies the device tensors into pinned host memory (at the link's speed) and `place`
keeps the pinned host tensor of everything it moves onto the device (its "host copy"): from the second eviction on,
offloading and a re-plan that streams more blocks only drop device tensors, and placing again copies from pinned
memory at the link's speed, so a model evicted for the decoders every run costs no device→host copies. Pinning
happens on the first eviction, not the first placement: a model that is never evicted pins nothing beyond its
streamed blocks. Whoever changes a device tensor in place (weight patches) calls `forget_host_copies` for it first.

Two kinds of model hold no pinned memory of their own, since for them it would cost host memory for good and save
little time:
- a model without blocks (a decoder, the upsampler: ≤ 1 GiB each) keeps, as the host copy of a weight placed from
  its file, that file's view: evicting it copies nothing and holds no memory, and placing it again reads the file
  at pageable speed (from the page cache when the pages are still there), a few tenths of a second. The file must
  stay as it was while the model lives, as it must while it is first placed;
- a model whose class sets `PIN_STREAMED = False` (the text encoder: one forward per new prompt) streams its blocks
  straight from where they are, usually its file's pages, each page given back once copied: on a small card a
  pinned copy of its streamed share (4.6 GiB) sat beside the evicted transformer's for good, for one pageable
  copy's worth of time a prompt (docs/PERFORMANCE.md, "Host memory").

The streamer works on whatever tensors of the blocks are off the device when it is installed, or on the tensors its
caller picks, so it also covers a placement made by someone else (ComfyUI's partial loading leaves whole layers on the
host). A streamed tensor may carry a transform, applied to its device copy each time the block runs (a weight patch
that is not baked into the host copy).

A weight read from its file is a view of the file's memory map; once `place`, `adopt` or the streamer has copied it to
the device or into pinned memory, its pages are given back to the file (files/mapped_pages.py), so a placement never
holds the file's pages beside the copies.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import torch
from torch import nn

from .errors import LTX25Error
from .files.mapped_pages import FileMappings

log = logging.getLogger("ltx25")
SLOTS = 2          # the block being computed, and the next one being copied
ALIGN = 256        # bytes: every tensor view in a slot starts on a boundary any kernel accepts
GIB = 2**30
HOST_SPARE_SHARE = 0.25  # share of the machine's RAM that pinned host copies always leave available

# (owner module, tensor name, tensor) → whether it streams; (owner module, tensor name) → a transform or None
Select = Callable[[nn.Module, str, torch.Tensor], bool]
Transform = Callable[[torch.Tensor], torch.Tensor]
TransformOf = Callable[[nn.Module, str], "Transform | None"]


def tensor_bytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _owned_tensors(module: nn.Module) -> Iterator[tuple[nn.Module, str, torch.Tensor]]:
    """(owner, name, tensor) for every parameter and buffer under `module`, each tensor once."""
    seen: set[int] = set()
    for owner in module.modules():
        for table in (owner._parameters, owner._buffers):
            for name, tensor in table.items():
                if tensor is not None and id(tensor) not in seen:
                    seen.add(id(tensor))
                    yield owner, name, tensor


def _concrete(device: torch.device | str) -> torch.device:
    """`cuda` → `cuda:<current>` and `cpu:N` → `cpu`, so comparisons with a tensor's device hold (a CUDA tensor's
    device always has an index, a CPU tensor's never)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    if device.type == "cpu":
        return torch.device("cpu")
    return device


def blocks_of(model: nn.Module) -> list[nn.Module]:
    """The model's streamable blocks in execution order (empty for a model that declares none)."""
    declared = getattr(model, "streamable_blocks", None)
    return [block for blocks in declared() for block in blocks] if callable(declared) else []


# ---------------------------------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class Placement:
    """What a placement keeps on the device and what streams, in bytes."""
    total_blocks: int
    resident_blocks: int
    resident_indices: tuple[int, ...]  # which blocks stay on the device, spread among the streamed ones
    resident_bytes: int     # weights kept on the device (blocks and everything else)
    streamed_bytes: int     # copied host → device once per forward
    slot_bytes: int         # the two device slots the streamed blocks pass through
    working_bytes: int      # the caller's activation estimate

    @property
    def peak_bytes(self) -> int:
        return self.resident_bytes + self.slot_bytes + self.working_bytes

    def describe(self, name: str) -> str:
        if not self.streamed_bytes:
            return (f"{name}: fully resident, {self.resident_bytes / GIB:.2f} GiB of weights + "
                    f"{self.working_bytes / GIB:.2f} GiB working memory")
        return (f"{name}: {self.resident_blocks} of {self.total_blocks} blocks resident "
                f"({self.resident_bytes / GIB:.2f} GiB on the device), {self.total_blocks - self.resident_blocks} "
                f"streamed from host memory ({self.streamed_bytes / GIB:.2f} GiB per forward, through "
                f"{self.slot_bytes / GIB:.2f} GiB of slots); expected peak {self.peak_bytes / GIB:.2f} GiB")


def spread(total: int, streamed: int) -> tuple[int, ...]:
    """The indices of `streamed` of `total` blocks, as evenly spaced as possible (each in the middle of its share)."""
    return tuple(int((j + 0.5) * total / streamed) for j in range(streamed))


def plan_placement(other_bytes: int, block_bytes: Sequence[int], working_bytes: int, budget: int,
                   where: str = "model") -> Placement:
    """Which blocks stay resident within `budget` bytes: everything that is not a block (`other_bytes`) and the
    working memory always are; streaming costs two slots of the largest streamed block; as many blocks as then fit
    stay resident, the streamed ones spread evenly between them (`spread`). Raises when even streaming every block
    does not fit."""
    n = len(block_bytes)
    total = other_bytes + sum(block_bytes)
    if total + working_bytes <= budget:
        return Placement(n, n, tuple(range(n)), total, 0, 0, working_bytes)
    slot = SLOTS * max(block_bytes, default=0)
    floor = other_bytes + slot + working_bytes
    if not block_bytes or floor > budget:
        raise LTX25Error(where, "the memory needed even with every block streamed", f"{floor / GIB:.2f} GiB "
                         f"({other_bytes / GIB:.2f} GiB of other weights, {slot / GIB:.2f} GiB of slots, "
                         f"{working_bytes / GIB:.2f} GiB working memory)", f"at most the {budget / GIB:.2f} GiB "
                         "available", "Free device memory (close other programs, unload other models), lower the "
                         "resolution or frame count, or run this model on the CPU.")
    for streamed_count in range(1, n + 1):
        streamed = set(spread(n, streamed_count))
        resident = tuple(i for i in range(n) if i not in streamed)
        if floor + sum(block_bytes[i] for i in resident) <= budget:
            break
    streamed_bytes = sum(block_bytes[i] for i in streamed)
    return Placement(n, len(resident), resident, total - streamed_bytes, streamed_bytes, slot, working_bytes)


def place(model: nn.Module, device: torch.device, budget: int, working_bytes: int = 0,
          where: str = "model", keep_host: bool = False) -> Placement:
    """Move `model` onto `device` within `budget` bytes (weights + `working_bytes`), streaming the blocks that do not
    fit; any earlier streamer is removed first. `keep_host`: keep host copies of what moves onto the device (pinned,
    or the file's views for a model without blocks: module docstring). Returns the placement (log it: it is the
    plan users read)."""
    remove_streamer(model)
    device = _concrete(device)
    blocks = blocks_of(model)
    block_ids = {id(t) for block in blocks for _, _, t in _owned_tensors(block)}
    other = [t for _, _, t in _owned_tensors(model) if id(t) not in block_ids]
    block_bytes = [tensor_bytes([t for _, _, t in _owned_tensors(block)]) for block in blocks]
    plan = plan_placement(tensor_bytes(other), block_bytes, working_bytes, budget, where)
    resident = set(plan.resident_indices)
    streamed_blocks = [block for i, block in enumerate(blocks) if i not in resident]
    streamed = {id(m) for block in streamed_blocks for m in block.modules()}
    copies = _host_copies(model)
    files = FileMappings.current()
    keep_views = keep_host and not blocks
    for owner in model.modules():  # each owner's direct tensors go where its block goes
        target = torch.device("cpu") if id(owner) in streamed else device
        for table in (owner._parameters, owner._buffers):
            for name, tensor in table.items():
                if tensor is None or tensor.device == target:
                    continue
                if target.type == "cpu":
                    kept = copies.pop(id(tensor), None)
                    _assign(table, name, kept[1] if kept is not None else tensor.to(target))
                    continue
                pinned = tensor.device.type == "cpu" and tensor.is_pinned()
                _assign(table, name, tensor.to(target, non_blocking=pinned))
                if pinned and keep_host or keep_views and files.mapping_of(tensor) is not None:
                    copies[id(table[name])] = (table[name], tensor)
                if not pinned:  # a synchronous copy: the source's bytes are read by now
                    files.release(tensor)
    if streamed_blocks:
        BlockStreamer(blocks, device, force_stream=streamed_blocks, files=files,
                      pin=getattr(model, "PIN_STREAMED", True)).install(model)
    return plan


def _host_copies(model: nn.Module) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """id(device tensor) → (that tensor, its host copy: pinned, or a view of the file it was placed from); the
    device tensor is held so its id stays unique."""
    return vars(model).setdefault("_ltx25_host_copies", {})


def _pin_room() -> int:
    """Bytes that may still be pinned: what the system has available beyond `HOST_SPARE_SHARE` of its RAM (pinned
    pages cannot be swapped out, so some room is left for everything else); 0 where /proc/meminfo is missing."""
    try:
        with open("/proc/meminfo") as meminfo:
            fields = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in meminfo}
        return max(fields["MemAvailable"] - int(fields["MemTotal"] * HOST_SPARE_SHARE), 0)
    except (OSError, KeyError, ValueError, IndexError):
        return 0


def forget_host_copies(model: nn.Module, tensors: Sequence[torch.Tensor]) -> dict[int, torch.Tensor]:
    """Drop the host copies of `tensors` (about to change in place on the device, or to leave the model):
    offloading copies them back. Returns the dropped copies, id(tensor) → host tensor (pinned, or a view of the
    file; they hold the values the device tensors have now)."""
    copies = _host_copies(model)
    dropped = {}
    for tensor in tensors:
        kept = copies.pop(id(tensor), None)
        if kept is not None:
            dropped[id(tensor)] = kept[1]
    return dropped


def offload(model: nn.Module, device: torch.device | str = "cpu", keep_host: bool = False) -> None:
    """Move `model` off the compute device: tensors with a host copy take it back (no copy); with `keep_host` the
    rest are copied into new pinned host memory (while `_pin_room` allows), otherwise into pageable memory."""
    remove_streamer(model)
    copies = vars(model).pop("_ltx25_host_copies", {})
    device = torch.device(device)
    pin_room = _pin_room() if keep_host and device.type == "cpu" else 0
    pending = set()
    for owner in model.modules():
        for table in (owner._parameters, owner._buffers):
            for name, tensor in table.items():
                if tensor is None or tensor.device.type == device.type:
                    continue
                kept = copies.get(id(tensor))
                nbytes = tensor.numel() * tensor.element_size()
                if kept is not None:
                    host = kept[1]
                elif tensor.device.type == "cuda" and pin_room >= nbytes:
                    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
                    host.copy_(tensor, non_blocking=True)
                    pending.add(tensor.device)
                    pin_room -= nbytes
                else:
                    host = tensor.to(device)
                _assign(table, name, host)
    for source in pending:  # the device tensors may be freed only once their copies have landed
        torch.cuda.synchronize(source)


def discard(model: nn.Module) -> None:
    """Free `model`'s weights for good (its last user is done with it): the streamer and the host copies go and
    every tensor becomes a meta placeholder, on the device and on the host. Nothing is copied: offloading a model
    that is about to be dropped would copy all of it into new host memory only to free it, and that copy would sit
    beside the host copies of the model it was evicted for (the text encoder's release beside the transformer's).
    A forward after this fails instead of running on missing weights."""
    remove_streamer(model)
    vars(model).pop("_ltx25_host_copies", None)
    for owner in model.modules():
        for table in (owner._parameters, owner._buffers):
            for name, tensor in table.items():
                if tensor is not None and not tensor.is_meta:
                    _assign(table, name, tensor.to("meta"))


def _assign(table: dict, name: str, value: torch.Tensor) -> None:
    old = table[name]
    if isinstance(old, nn.Parameter):
        value = nn.Parameter(value, requires_grad=old.requires_grad)
    table[name] = value


def streamer_of(model: nn.Module) -> "BlockStreamer | None":
    return vars(model).get("_ltx25_streamer")


def is_streaming(model: nn.Module) -> bool:
    streamer = streamer_of(model)
    return streamer is not None and streamer.streamed_count > 0


def remove_streamer(model: nn.Module) -> None:
    streamer = vars(model).pop("_ltx25_streamer", None)
    if streamer is not None:
        streamer.remove()


# ---------------------------------------------------------------------------------------------------- streaming
@dataclass
class _Streamed:
    """One block's host tensors and where each sits in a slot."""
    index: int
    entries: list[tuple[dict, str, torch.Tensor, int]]  # (owner table, name, host tensor, byte offset in a slot)
    nbytes: int
    transforms: dict[int, Transform] = field(default_factory=dict)  # entry index → applied to its device copy


class BlockStreamer:
    """Swaps host-resident block tensors through device slots around each block's forward (see the module
    docstring). On a CUDA device the next streamed block is copied on a side stream while this one computes; the
    copy into a slot waits until the block that last used the slot has finished with it."""

    def __init__(self, blocks: Sequence[nn.Module], device: torch.device,
                 force_stream: Sequence[nn.Module] = (), select: Select | None = None,
                 transform: TransformOf | None = None, files: FileMappings | None = None, pin: bool = True) -> None:
        """Stream the blocks' tensors that `select` picks (default: those not on `device`, and every tensor of the
        `force_stream` blocks); a picked tensor not in host memory is moved there. `transform(owner, name)` may give
        a function applied to a streamed tensor's device copy each time its block runs. `files`: the process's file
        mappings (read now when not given), whose pages a view copied into pinned memory gives back. Without `pin`
        the tensors are copied from where they are (pageable: each copy holds the thread until the bytes are read),
        and a file view's pages are given back after each copy."""
        self.blocks, self.device, self.pin = list(blocks), _concrete(device), pin
        files = self.files = files if files is not None else FileMappings.current()
        # streamed block index → its tensors that are pageable views of a file, whose pages each copy gives back
        self.release_after_copy: dict[int, list[torch.Tensor]] = {}
        forced = set(map(id, force_stream))
        self.streamed: dict[int, _Streamed] = {}
        for index, block in enumerate(self.blocks):
            entries, transforms, offset = [], {}, 0
            for owner, name, tensor in _owned_tensors(block):
                table = owner._parameters if name in owner._parameters else owner._buffers
                picked = (select(owner, name, tensor) if select is not None
                          else tensor.device != self.device or id(block) in forced)
                if not picked:
                    continue
                host = tensor.detach()
                if host.device.type != "cpu":
                    host = host.to("cpu")
                if pin and self.device.type == "cuda" and not host.is_pinned():
                    host = host.pin_memory()  # pinned: the copy is asynchronous and runs at the link's speed
                    files.release(tensor)
                _assign(table, name, host)
                if not pin and not host.is_pinned() and files.mapping_of(host) is not None:
                    # (a pinned source, such as ComfyUI's registered pages, is copied asynchronously: kept)
                    self.release_after_copy.setdefault(index, []).append(host)
                function = transform(owner, name) if transform is not None else None
                if function is not None:
                    transforms[len(entries)] = function
                entries.append((table, name, table[name], offset))
                offset += -(-host.numel() * host.element_size() // ALIGN) * ALIGN
            if entries:
                self.streamed[index] = _Streamed(index, entries, offset, transforms)
        self.order = sorted(self.streamed)
        self.slot_bytes = max((s.nbytes for s in self.streamed.values()), default=0)
        self.slots: list[torch.Tensor] = []
        self.slot_of: dict[int, int] = {}          # streamed block index → the slot its tensors are in
        self.ready: dict[int, object] = {}         # block index → event: its copy has finished
        self.free: list[object] = [None] * SLOTS   # slot → event: its last user has finished
        self.copy_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.next_slot = 0
        self.hooks: list = []
        self.bytes_copied = 0

    @property
    def streamed_count(self) -> int:
        return len(self.order)

    def install(self, model: nn.Module) -> "BlockStreamer":
        for index, block in enumerate(self.blocks):
            if index in self.streamed:
                self.hooks.append(block.register_forward_pre_hook(lambda _m, _a, i=index: self._enter(i)))
                self.hooks.append(block.register_forward_hook(lambda _m, _a, _o, i=index: self._leave(i)))
        model._ltx25_streamer = self
        return self

    def remove(self) -> None:
        for hook in self.hooks:
            hook.remove()
        self.hooks.clear()
        if self.copy_stream is not None:
            self.copy_stream.synchronize()
        self.slots, self.slot_of, self.ready = [], {}, {}

    # the copies ---------------------------------------------------------------------------------------------
    def _slot_views(self, streamed: _Streamed, slot: int) -> list[torch.Tensor]:
        buffer = self.slots[slot]
        return [buffer[offset:offset + host.numel() * host.element_size()].view(host.dtype).view(host.shape)
                for _, _, host, offset in streamed.entries]

    def _stage(self, index: int) -> None:
        """Start copying block `index` into the next slot (on the side stream on CUDA)."""
        if not self.slots:
            self.slots = [torch.empty(self.slot_bytes, dtype=torch.uint8, device=self.device) for _ in range(SLOTS)]
        slot, streamed = self.next_slot, self.streamed[index]
        self.next_slot = (slot + 1) % SLOTS
        for other, used in list(self.slot_of.items()):
            if used == slot:
                del self.slot_of[other]
                self.ready.pop(other, None)
        if self.copy_stream is None:
            for view, (_, _, host, _) in zip(self._slot_views(streamed, slot), streamed.entries):
                view.copy_(host)
        else:
            with torch.cuda.stream(self.copy_stream):
                if self.free[slot] is not None:
                    self.copy_stream.wait_event(self.free[slot])
                for view, (_, _, host, _) in zip(self._slot_views(streamed, slot), streamed.entries):
                    view.copy_(host, non_blocking=True)
                event = torch.cuda.Event()
                event.record(self.copy_stream)
                self.ready[index] = event
        for host in self.release_after_copy.get(index, ()):  # a copy from pageable memory has read its source
            self.files.release(host)                         # when it returns
        self.slot_of[index] = slot
        self.bytes_copied += streamed.nbytes

    def _enter(self, index: int) -> None:
        if index not in self.slot_of:
            self._stage(index)
        if index in self.ready:
            torch.cuda.current_stream(self.device).wait_event(self.ready.pop(index))
        streamed = self.streamed[index]
        views = self._slot_views(streamed, self.slot_of[index])
        for i, (view, (table, name, _, _)) in enumerate(zip(views, streamed.entries)):
            function = streamed.transforms.get(i)
            # the slot is copied afresh for every forward, so a transform may work on the copy in place
            table[name] = view if function is None else function(view)
        following = self.order[(self.order.index(index) + 1) % len(self.order)]
        if following != index and following not in self.slot_of:
            self._stage(following)

    def _leave(self, index: int) -> None:
        streamed = self.streamed[index]
        for table, name, host, _ in streamed.entries:
            table[name] = host
        slot = self.slot_of[index]
        if self.copy_stream is not None:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.device))
            self.free[slot] = event
        del self.slot_of[index]  # the next forward copies it again: the slot is someone else's by then


def adopt(model: nn.Module, device: torch.device, select: Select | None = None,
          transform: TransformOf | None = None) -> BlockStreamer | None:
    """After someone else placed `model` partly on `device`: move the non-block tensors it left in host memory onto
    the device and stream the blocks' tensors `select` picks (default: those not on the device), each with its
    `transform` (see BlockStreamer). Returns the streamer, or None when nothing streams."""
    remove_streamer(model)
    device = _concrete(device)
    blocks = blocks_of(model)
    in_blocks = {id(m) for block in blocks for m in block.modules()}
    files = FileMappings.current()
    for owner in model.modules():
        if id(owner) in in_blocks:
            continue
        for table in (owner._parameters, owner._buffers):
            for name, tensor in table.items():
                if tensor is not None and tensor.device != device:
                    _assign(table, name, tensor.to(device))
                    files.release(tensor)
    streamer = BlockStreamer(blocks, device, select=select, transform=transform, files=files,
                             pin=getattr(model, "PIN_STREAMED", True))
    if not streamer.streamed_count:
        return None
    return streamer.install(model)


def mapped_views(model: nn.Module, files: FileMappings) -> list[torch.Tensor]:
    """The model's tensors that are views of a file mapping, detached (for `release_moved` after a placement made by
    someone else)."""
    return [t.detach() for _, _, t in _owned_tensors(model) if files.mapping_of(t) is not None]


def release_moved(model: nn.Module, views: Sequence[torch.Tensor], files: FileMappings) -> int:
    """Give back the pages of the `views` (from `mapped_views`) that the model no longer holds: someone else's
    placement copied them off the host (ComfyUI's `module.to(device)` keeps the parameter and swaps its data). The
    bytes advised."""
    held = {t.data_ptr() for _, _, t in _owned_tensors(model) if t.device.type == "cpu"}
    return sum(files.release(view) for view in views if view.data_ptr() not in held)


def outside_blocks_bytes(model: nn.Module) -> int:
    """Bytes of the model's tensors outside its streamable blocks: what stays on the device however much streams."""
    in_blocks = {id(t) for block in blocks_of(model) for _, _, t in _owned_tensors(block)}
    return tensor_bytes([t for _, _, t in _owned_tensors(model) if id(t) not in in_blocks])


def slot_reserve(model: nn.Module) -> int:
    """Device bytes the two streaming slots take at most (two of the largest block), 0 for a model without blocks."""
    blocks = blocks_of(model)
    return SLOTS * max((tensor_bytes([t for _, _, t in _owned_tensors(b)]) for b in blocks), default=0)
