"""The launcher's parts below `pydtnn.cli`, the composition root: the flags (flags), the run configuration and
its checks across flags (config), the ranks' agreement on flags (agreement), memory limits (limits), and the
steps that `pydtnn.cli.run` composes (devices, data_and_model, split, banner, outputs)."""
