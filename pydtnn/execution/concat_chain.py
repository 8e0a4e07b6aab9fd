"""Dense layers without their quadratic copies: consecutive ConcatenationBlocks that each put their new
maps in front of their input (DenseNet's `ConcatenationBlock(path, [])`) share one array per chain.

Concatenating anew in every layer copies the whole input each time: a chain of L layers copies O(L^2)
channels. Here the first block allocates the array for the whole chain, channels-last, with `room`
channels free in front of its own output; each later block writes only its k new maps into the room just
in front of its input, which already is in place, and returns the wider slice. The last block's output is
the whole array, contiguous. In between, outputs are channel slices that the next block's BatchNormalization
reads in place (`CPUBackend._rows`), and the backward hands the identity path's gradient, also a slice,
to that BatchNormalization to add in its own pass (`Layer.backward_adds`).

A block finds its input in place only when it is exactly the array the block before it returned (checked by
identity, claimed once), so anything else (a block run alone, an input from elsewhere) takes the copy.

The batch statistics of a dense layer's first BatchNormalization are per channel, and all but its k new
channels are the previous layer's input, which that layer's BatchNormalization has just summed: in training
the chain hands those moments on (`hand_on_moments`), so each one sums only its new channels, not the
whole (growing) input again.
"""
from __future__ import annotations


def chained(block) -> bool:
    """Whether `block` may share its chain's array: (path, []) paths, on a channels-last 4-D layout."""
    return (len(block.paths) == 2 and not block.paths[1] and bool(block.paths[0])
            and len(block.shape) == 3 and getattr(block.backend, "channel_axis", 1) == 3)


def link_concat_chains(layers) -> int:
    """Link every run of consecutive, exactly-ConcatenationBlock layers in `layers` (blocks' paths
    included) that `chained` allows: each block's room is the new channels of the blocks after it in the run.
    Returns the number of links."""
    from pydtnn.layers.blocks import ConcatenationBlock
    links, run = 0, []

    def close(run):
        room = 0
        for block in reversed(run):
            block.room = room
            room += block.sizes[0]
        return max(len(run) - 1, 0)

    for layer in layers:
        if type(layer) is ConcatenationBlock and chained(layer):
            layer.chain_prev = run[-1] if run else None
            run.append(layer)
        else:
            links += close(run)
            run = []
            if type(layer) is ConcatenationBlock:
                layer.chain_prev, layer.room = None, 0
        for path in getattr(layer, "paths", []):
            links += link_concat_chains(path)
    return links + close(run)


def _first_batchnorm(block):
    """The BatchNormalization that starts the block's new path (its class exactly), or None."""
    from pydtnn.layers.batchnorm import BatchNormalization
    path = block.paths[0]
    layer = path[0] if path else None
    return layer if type(layer) is BatchNormalization else None


def hand_on_moments(block, x) -> bool:
    """Before a training forward of `block` on x: where x is its chain predecessor's output in place (this
    pass's: claimable), give the block's first BatchNormalization the batch moments of x's last channels,
    the predecessor's input, from the predecessor's own first BatchNormalization. Both must normalize with
    their replica's statistics (not synchronized), and their backend, the model's, keep moments
    (`batch_moments` checks both for the predecessor). Returns whether it did."""
    prev = block.chain_prev
    if prev is None or prev._out is not x:
        return False
    first, before = _first_batchnorm(block), _first_batchnorm(prev)
    if first is None or before is None or first.sync is not None:
        return False
    moments = before.batch_moments()
    if moments is None or moments[0].size != x.shape[-1] - prev.sizes[0]:
        return False
    first.known_moments = moments
    return True
