"""The data: read as published, split and normalised, stored, and fed to the loop.

- ``readers``: the built-in sources as their publishers ship them (digits, synthetic, MNIST/Fashion-MNIST idx,
  CIFAR-10), each read into a ``Raw``.
- ``text``: UTF-8 text as byte tokens, split by position, cut into sequences.
- ``user_data``: your data: an image folder or a dataset factory (or LightningDataModule), read into a ``Raw``.
- ``datamodule``: a LightningDataModule's splits as the batches its loaders give.
- ``prepare``: the seeded split, train-only normalisation, checksummed files under data/prepared/, loading them.
- ``splits``: what the loop reads: ``Split`` (stored values + normalisation) and ``Prepared``.
- ``loader``: the loop's batches: device tensors or a streaming DataLoader, crop-and-flip, input wait.
"""
