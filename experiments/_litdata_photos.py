"""LitData's dataset for ``experiments.remote_loading``, in a module of its own: LitData spawns its workers,
which import the dataset's class by name (and this module needs litdata, which the project does not)."""

from __future__ import annotations

import litdata.streaming.downloader
from litdata import StreamingDataset

from experiments.remote_loading import Augment

# LitData 0.2.76 fetches chunks with obstore, whose client it builds with options of its own and no
# allow_http: the loopback endpoint speaks plain HTTP. The same options, and that one (no speed change).
litdata.streaming.downloader._OBSTORE_CLIENT_OPTIONS = {
    **litdata.streaming.downloader._OBSTORE_CLIENT_OPTIONS,
    "allow_http": True,
}


class Photos(StreamingDataset):
    """The samples ``remote_loading`` optimized (``{"image": JPEG bytes, "label": int}``), decoded and
    augmented in LitData's workers."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.augment = Augment()

    def __getitem__(self, index):
        sample = super().__getitem__(index)
        return self.augment(sample["image"], sample["label"])
