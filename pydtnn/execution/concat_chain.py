"""Dense layers without their quadratic copies: consecutive blocks that declare `shares_chain_array`
(DenseNet's `ConcatenationBlock(path, [])`, channels-last, which puts its new maps in front of its input)
share one array per chain, a `DenseChain`.

Concatenating anew in every layer copies the whole input each time: a chain of L layers copies O(L^2)
channels. Here the first block allocates the array for the whole chain, channels-last, with room channels
free in front of its own output; each later block writes only its k new maps into the room just in front
of its input, which already is in place, and returns the wider slice. The last block's output is the whole
array, contiguous. In between, outputs are channel slices that the next block's BatchNormalization reads
in place (`CPUBackend._rows`), and the backward hands the identity path's gradient, also a slice, to that
BatchNormalization to add in its own pass (`Layer.backward_adds`).

A block finds its input in place only when it is exactly the array the block before it returned (checked by
identity, claimed once), so anything else (a block run alone, an input from elsewhere) takes the copy.

The batch statistics of a dense layer's first layer, where it declares `takes_known_moments` (a
BatchNormalization), are per channel, and all but its k new channels are the previous layer's input, which
that layer's first layer has just summed: in training the chain hands those moments on
(`DenseChain.hand_on_moments`), so each one sums only its new channels, not the whole (growing) input again.

The plan holds the chain and hands it to each block's forward as `chain=` and to each receiving layer's
forward as `moments=`: the layers keep nothing of it, and a block run on its own copies.
"""
from __future__ import annotations

from pydtnn.execution.declared import declared, planned_paths


class DenseChain:
    """Blocks that share one array, in forward order: `rooms[i]` channels are left free in front of block
    i's output, where the new maps of the blocks after it go; `hand_offs` are the (first layer of block i-1,
    first layer of block i) pairs that hand on batch moments. The plan gives it to the blocks' forward as
    `chain=` and to the receiving layers' forward as `moments=`."""

    def __init__(self, blocks):
        self.blocks = list(blocks)
        self.rooms, room = [], 0
        for block in reversed(self.blocks):
            self.rooms.insert(0, room)
            room += block.sizes[0]
        self._index = {block: i for i, block in enumerate(self.blocks)}
        firsts = [block.paths[0][0] for block in self.blocks]
        takers = [layer if declared(layer, "takes_known_moments") else None for layer in firsts]
        self._hand_offs = {i: (takers[i - 1], takers[i]) for i in range(1, len(takers))
                           if takers[i - 1] is not None and takers[i] is not None}
        self._outs = [None] * len(self.blocks)  # each block's last output, while the next has not claimed its room
        self._known = {}                        # receiving layer -> moments for its next training forward

    @property
    def hand_offs(self):
        return list(self._hand_offs.values())

    def merge(self, block, new, x):
        """The block's output: its new maps written into the room in front of x, which stays in place where it
        is exactly what the block before returned (its room claimed once); else copied into a new array."""
        i = self._index[block]
        room, k, buf = self.rooms[i], new.shape[-1], None
        if i > 0 and self._outs[i - 1] is x:           # x already sits in the array: claim its room
            buf, self._outs[i - 1] = x.base, None
        if buf is None:
            buf = block.xp.empty(x.shape[:-1] + (room + k + x.shape[-1],), block.backend.dtype)
            buf[..., room + k:] = x
        buf[..., room:room + k] = new
        y = buf[..., room:]
        if room:
            self._outs[i] = y
        return y

    def hand_on_moments(self, block, x) -> bool:
        """Before a training forward of `block` on x: where x is the previous block's output in place
        (claimable), give the block's first layer the batch moments of x's last channels, the previous
        block's input, from the previous block's first layer (`batch_moments()`: None where it has none of
        its own). The receiver takes them once (`take_moments`). Returns whether it did."""
        i = self._index[block]
        if i == 0 or self._outs[i - 1] is not x or i not in self._hand_offs:
            return False
        before, first = self._hand_offs[i]
        moments = before.batch_moments()
        if moments is None or moments[0].size != x.shape[-1] - self.blocks[i - 1].sizes[0]:
            return False
        self._known[first] = moments
        return True

    def take_moments(self, layer):
        """The moments handed on to `layer` for this training forward, once; None if none were."""
        return self._known.pop(layer, None)

    def __repr__(self):
        return f"DenseChain({' -> '.join(block.name for block in self.blocks)}; rooms {self.rooms})"


def link_concat_chains(layers) -> list[DenseChain]:
    """A DenseChain for every run of two or more consecutive layers in `layers` (the planned paths of blocks
    included) that declare `shares_chain_array`. Returns the chains, in the order of their first blocks."""
    chains, run, run_at = [], [], 0

    def close():
        if len(run) > 1:
            chains.insert(run_at, DenseChain(run))

    for layer in layers:
        if declared(layer, "shares_chain_array"):
            if not run:
                run_at = len(chains)
            run.append(layer)
        else:
            close()
            run = []
        for path in planned_paths(layer):
            chains += link_concat_chains(path)
    close()
    return chains
