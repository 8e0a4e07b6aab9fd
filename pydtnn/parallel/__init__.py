"""Data parallelism: communicators, the batch split and its policies, and `DataParallel` for your own loop."""


def __getattr__(name):
    # lazy: `pydtnn.parallel.balance` and friends stay importable without the model's layers
    if name == "DataParallel":
        from pydtnn.parallel.data_parallel import DataParallel
        return DataParallel
    raise AttributeError(f"module 'pydtnn.parallel' has no attribute {name!r}")


__all__ = ["DataParallel"]
