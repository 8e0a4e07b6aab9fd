"""Dataset loaders: mnist, cifar10, imagenet (NPZ shards), synthetic."""
